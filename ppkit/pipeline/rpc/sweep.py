"""Run the tutorial's experiment: train a few batches at each micro-batch size, collect a table.

    result = run_sweep(PipelineConfig(batch_size=32, image_size=64, microbatch_sizes=(1, 2, 4, 8)))
    print(result.format_table())

The work per batch is the tutorial's: random images, one-hot labels, MSE loss, a distributed
backward, one SGD step (lr 0.05) on every shard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn

from ppkit.pipeline.bubble import BubblePrediction, predict_from_timeline
from ppkit.pipeline.rpc import resources
from ppkit.pipeline.rpc.config import PipelineConfig, check_microbatch_size, num_microbatches
from ppkit.pipeline.rpc.model import PipelineModel
from ppkit.pipeline.rpc.optimizer import PipelineOptimizer
from ppkit.pipeline.timeline import Timeline

LEARNING_RATE = 0.05  # the tutorial's


def make_batch(config: PipelineConfig, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``index`` of random inputs and one-hot labels, the same for every configuration."""
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + index)
    inputs = torch.randn(config.batch_size, 3, config.image_size, config.image_size, generator=generator)
    classes = torch.randint(0, config.num_classes, (config.batch_size, 1), generator=generator)
    labels = torch.zeros(config.batch_size, config.num_classes).scatter_(1, classes, 1.0)
    return inputs, labels


@dataclass
class RunResult:
    """One configuration: ``num_batches`` training steps at one micro-batch size."""

    microbatch_size: int
    num_microbatches: int
    batch_seconds: list[float]
    batch_size: int
    timeline: Timeline  # of the last batch
    prediction: BubblePrediction | None

    @property
    def seconds_per_batch(self) -> float:
        return sum(self.batch_seconds) / len(self.batch_seconds)

    @property
    def images_per_second(self) -> float:
        return self.batch_size / self.seconds_per_batch

    @property
    def measured_span(self) -> float:
        """First forward start to last backward end, on the stages (last batch)."""
        return self.timeline.span()

    @property
    def model_ratio(self) -> float | None:
        """Measured span over the bubble model's prediction (1.0 = no overhead at all)."""
        if self.prediction is None or self.prediction.total <= 0:
            return None
        return self.measured_span / self.prediction.total

    def row(self) -> dict:
        return {
            "microbatch_size": self.microbatch_size,
            "num_microbatches": self.num_microbatches,
            "seconds_per_batch": round(self.seconds_per_batch, 4),
            "images_per_second": round(self.images_per_second, 2),
            "measured_span_s": round(self.measured_span, 4),
            "bubble_model_s": None if self.prediction is None else round(self.prediction.total, 4),
            "measured_over_model": None if self.model_ratio is None else round(self.model_ratio, 2),
        }


COLUMNS = (
    ("microbatch_size", "micro-batch size", "{}"),
    ("num_microbatches", "micro-batches", "{}"),
    ("seconds_per_batch", "s / batch", "{:.3f}"),
    ("images_per_second", "images/s", "{:.1f}"),
    ("measured_span_s", "measured fwd+bwd s", "{:.3f}"),
    ("bubble_model_s", "bubble model s", "{:.3f}"),
    ("measured_over_model", "measured / model", "{:.2f}"),
)


def format_rows(rows: list[dict], markdown: bool = False) -> str:
    """A fixed-width (or Markdown) table of :meth:`RunResult.row` dicts."""
    return format_table(rows, COLUMNS, markdown)


def format_table(rows: list[dict], columns, markdown: bool = False) -> str:
    """``rows`` (dicts) as a fixed-width or Markdown table; ``columns``: (key, heading, format)."""
    heads = [head for _, head, _ in columns]
    body = [[("-" if row[key] is None else fmt.format(row[key])) for key, _, fmt in columns]
            for row in rows]
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---:" for _ in heads) + "|"]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in body]
    return "\n".join(lines)


@dataclass
class SweepResult:
    config: PipelineConfig
    runs: list[RunResult] = field(default_factory=list)

    def rows(self) -> list[dict]:
        return [run.row() for run in self.runs]

    def format_table(self, markdown: bool = False) -> str:
        return format_rows(self.rows(), markdown)


def train_batches(model: PipelineModel, optimizer: PipelineOptimizer, config: PipelineConfig,
                  microbatch_size: int, progress=None) -> RunResult:
    """Train ``config.num_batches`` batches at ``microbatch_size``; time each, trace the last.

    ``progress(done, total)`` is called after every batch.
    """
    check_microbatch_size(microbatch_size, config.batch_size)
    model.microbatch_size = microbatch_size
    loss_fn = nn.MSELoss()
    seconds, timeline = [], None
    model.drain_events()  # drop anything recorded before this run
    for index in range(config.num_batches):
        inputs, labels = make_batch(config, index)
        start = time.time()
        with dist_autograd.context() as context_id:
            outputs = model(inputs)
            dist_autograd.backward(context_id, [loss_fn(outputs, labels)])
            backward_done = time.time()
            optimizer.step(context_id)
        seconds.append(time.time() - start)
        raw = model.drain_events()
        if index == config.num_batches - 1:
            timeline = Timeline.from_raw(
                raw, model.stage_labels(), num_microbatches(config.batch_size, microbatch_size),
                origin=start, marks={"backward done": backward_done, "optimizer done": start + seconds[-1]})
        if progress is not None:
            progress(index + 1, config.num_batches)
    prediction = predict_from_timeline(timeline) if timeline.events else None
    return RunResult(microbatch_size, timeline.num_microbatches, seconds, config.batch_size, timeline,
                     prediction)


def build_model(config: PipelineConfig) -> tuple[PipelineModel, PipelineOptimizer]:
    """The pipeline model and its per-shard SGD for ``config`` (an RPC world must be running).

    Each stage process also gets its share of the cores (``config.stage_threads``); what each got
    is in ``model.resources`` (:class:`ppkit.pipeline.rpc.resources.ProcessPlan` per process).
    """
    model = PipelineModel(config.placement, cut=config.cut, seed=config.seed,
                          num_classes=config.num_classes)
    try:
        model.resources = resources.assign(config.placement, config.stage_threads)
        model.train(config.train_mode)
        optimizer = PipelineOptimizer(model, torch.optim.SGD, lr=LEARNING_RATE)
    except BaseException:
        model.close()
        raise
    return model, optimizer


def run_sweep(config: PipelineConfig, *, progress=None, on_result=None, rebuild: bool = False,
              model: PipelineModel | None = None) -> SweepResult:
    """Train ``config.num_batches`` batches at every size in ``config.microbatch_sizes``.

    ``progress(done, total)`` counts batches over the whole sweep; ``on_result(run)`` is called after
    each configuration. ``rebuild``: fresh shards for every configuration (what the tutorial's one
    program per configuration does) instead of continuing to train the same ones. ``model``: use
    this model (its placement and cut) instead of building one; it is left open.
    """
    config.check()
    total = config.num_batches * len(config.microbatch_sizes)
    result = SweepResult(config)
    owned = model is None
    optimizer = None if owned else PipelineOptimizer(model, torch.optim.SGD, lr=LEARNING_RATE)
    try:
        for n, size in enumerate(config.microbatch_sizes):
            if model is None or (rebuild and owned and n > 0):
                if model is not None:
                    model.close()
                model, optimizer = build_model(config)
            done = n * config.num_batches
            step = None if progress is None else (lambda k, _t, done=done: progress(done + k, total))
            run = train_batches(model, optimizer, config, size, step)
            result.runs.append(run)
            if on_result is not None:
                on_result(run)
    finally:
        if owned and model is not None:
            model.close()
    return result
