"""RPC, GPipe and 1F1B side by side on one batch: time per step, each timeline next to the bubble
model, activation peaks, and checks that all three compute what one local ResNet50 computes.

    x, y = make_batch(8, 32)
    runs = compare_schedules(cluster, model, x, y, num_microbatches=4)   # model: an RPC PipelineModel
    print(format_table(runs)); plot_timelines(runs)

Timelines and the drawing come from ``ppkit.pipeline`` (``Timeline``, ``Event``, ``plot_gantt``),
so the RPC pipeline and torch.distributed.pipelining are measured and drawn the same way.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from ppkit.errors import ConfigError
from ppkit.models.resnet import DEFAULT_CUT, resnet50, split_resnet50
from ppkit.pipeline.bubble import BubblePrediction, bubble_fraction
from ppkit.pipeline.timeline import Event, Timeline
from ppkit.pipelining.stage import LOSSES, SCHEDULES, check_schedule, microbatch_size_of, train_step

KINDS = ("rpc", *SCHEDULES)  # every schedule a comparison can run
PHASE = {"F": "forward", "B": "backward"}
# "Equal" for these float32 computations. Convolutions pick their algorithm by batch size, so a
# micro-batch's gradients differ from the whole batch's in the last bits: measured up to 5.6e-5 of
# the largest gradient (64x64 images, micro-batches of 4 against a batch of 16, one thread per
# stage), 3.9e-7 at 32x32; and 2.0e-4 on an AMD EPYC (40x40, micro-batches of 2, cut after layer1:
# with one thread, 1x1 convolutions of fewer than 16 images take torch's native kernel, not oneDNN).
# A real mistake (a missing 1/m, a wrong micro-batch) is off by far more (0.5 and up).
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-3


@dataclass
class ScheduleRun:
    """Steps of one schedule on one batch: numbers per step, the last step's timeline."""

    schedule: str  # "rpc", "gpipe" or "1f1b"
    num_microbatches: int
    microbatch_size: int
    loss: float | None
    grads: list[dict] | None  # per stage, name -> gradient (last step)
    step_times: list[float]  # seconds, slowest stage, every step
    timeline: Timeline
    peak_activation_bytes: list[int] | None = None  # per stage; None where not measured (RPC)
    warmup_steps: int = 1  # leading step_times that also set the pipeline up

    @property
    def step_time(self) -> float:
        """Median seconds per step, without the warm-up steps (unless there is nothing else)."""
        return statistics.median(self.step_times[self.warmup_steps:] or self.step_times)

    @property
    def num_stages(self) -> int:
        return self.timeline.num_stages

    def idle_share(self) -> float:
        """Measured: the share of (stages x first-start-to-last-end) in which stages computed nothing."""
        span = self.timeline.span()
        busy = sum(self.timeline.busy(s, phase) for s in range(self.num_stages) for phase in PHASE.values())
        return 1.0 - busy / (self.num_stages * span) if span > 0 else 0.0

    def prediction(self) -> BubblePrediction:
        """The bubble model: this schedule's order of work with the measured time per micro-batch of
        each stage, and sending and waiting costing nothing (``prediction().schedule`` draws it)."""
        stages = range(self.num_stages)
        forward = [self.timeline.stage_time(s, "forward") for s in stages]
        backward = [self.timeline.stage_time(s, "backward") for s in stages]
        ideal = ideal_timeline(schedule_orders(self.schedule, self.num_stages, self.num_microbatches),
                               forward, backward)
        forward_end = max(e.end for e in ideal if e.phase == "forward")
        total = max(e.end for e in ideal)
        return BubblePrediction(forward, backward, self.num_microbatches, forward_end, total - forward_end,
                                ideal)


def merge_ranks(ranks: list[dict]) -> ScheduleRun:
    """One run from the per-rank results of ``train_step`` (in rank order)."""
    origin = min(r["step_start"] for r in ranks)
    events = sorted((Event(r["stage"], mb, PHASE[kind], t0 - origin, t1 - origin)
                     for r in ranks for kind, mb, t0, t1 in r["events"]), key=lambda e: (e.stage, e.start))
    first = ranks[0]
    labels = [f"stage {r['stage'] + 1} (rank {r['rank']})" for r in ranks]
    return ScheduleRun(
        first["schedule"], first["num_microbatches"], first["microbatch_size"], ranks[-1]["loss"],
        None if first["grads"] is None else [r["grads"] for r in ranks],
        [max(times) for times in zip(*(r["step_times"] for r in ranks))],
        Timeline(events, labels, first["num_microbatches"]),
        [r["peak_activation_bytes"] for r in ranks])


def run_schedule(cluster, x: torch.Tensor, y: torch.Tensor, schedule: str = "gpipe", *,
                 timeout: float | None = None, **options) -> ScheduleRun:
    """``train_step`` on every rank of a 2-rank ``cluster``, merged into one :class:`ScheduleRun`."""
    check_schedule(schedule)
    return merge_ranks(cluster.run(train_step, x, y, schedule, timeout=timeout, **options))


def _set_num_threads(num_threads: int) -> int:
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    return previous


def rpc_step(model, x: torch.Tensor, y: torch.Tensor, num_microbatches: int = 4, *, steps: int = 1,
             num_threads: int | None = 1, return_grads: bool = True) -> ScheduleRun:
    """The same steps through the RPC ``PipelineModel`` (eval mode, no optimizer step).

    The driver (this process) sends every micro-batch, gathers the logits, computes the loss and
    runs ``dist_autograd.backward``; the shards' timing events give the timeline. ``num_threads``
    per stage process, as in ``train_step`` (restored after).
    """
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc

    model.eval()
    model.microbatch_size = microbatch_size_of(len(x), num_microbatches)
    processes = dict.fromkeys(p.process for p in model.placement)
    if num_threads is not None:
        processes = {name: rpc.rpc_sync(name, _set_num_threads, args=(num_threads,)) for name in processes}
    model.drain_events()
    step_times, grads = [], None
    try:
        for i in range(steps):
            start = time.time()
            with dist_autograd.context() as context_id:
                loss = nn.functional.cross_entropy(model(x), y)
                dist_autograd.backward(context_id, [loss])
                step_times.append(time.time() - start)
                if return_grads and i == steps - 1:
                    grads = model.gradients(context_id)
            raw = model.drain_events()
    finally:
        for name, previous in processes.items():
            if previous is not None:
                rpc.rpc_sync(name, _set_num_threads, args=(previous,))
    timeline = Timeline.from_raw(raw, model.stage_labels(), num_microbatches, origin=start)
    return ScheduleRun("rpc", num_microbatches, model.microbatch_size, loss.item(), grads, step_times,
                       timeline)


def reference_step(x: torch.Tensor, y: torch.Tensor, cut: str = DEFAULT_CUT, seed: int = 0,
                   loss: str = "cross_entropy") -> dict:
    """The same step on one local model (eval-mode BN, whole batch): loss and gradients per shard."""
    model = resnet50(seed).eval()
    loss = LOSSES[loss](model(x), y)
    loss.backward()
    return {"loss": loss.item(),
            "grads": [{name: p.grad for name, p in shard.named_parameters()}
                      for shard in split_resnet50(model, cut)]}


def grad_difference(grads: list[dict], reference: list[dict]) -> float:
    """The largest gradient difference, relative to the largest reference gradient (0 = identical)."""
    if len(grads) != len(reference):
        raise ConfigError(f"{len(grads)} stages of gradients against {len(reference)} reference stages.")
    worst = scale = 0.0
    for mine, ref in zip(grads, reference):
        if mine.keys() != ref.keys():
            raise ConfigError("the two gradient sets are for different parameters; compare the same cut.")
        for name, g in ref.items():
            worst = max(worst, (mine[name] - g).abs().max().item())
            scale = max(scale, g.abs().max().item())
    return worst / scale


def schedule_orders(schedule: str, num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's order of work, ``("F" or "B", micro-batch)``.

    GPipe (and the RPC pipeline, whose loss needs every micro-batch's output): all forwards, then all
    backwards. 1F1B: stage ``s`` runs ``min(m, S - s)`` forwards, then alternates one backward and
    one forward, then the remaining backwards.
    """
    if schedule not in KINDS:
        raise ConfigError(f"unknown schedule {schedule!r}; choose from {', '.join(KINDS)}.")
    m = num_microbatches
    orders = []
    for s in range(num_stages):
        if schedule == "1f1b":
            warmup = min(m, num_stages - s)
            order = [("F", i) for i in range(warmup)]
            for i in range(m):
                order.append(("B", i))
                if warmup + i < m:
                    order.append(("F", warmup + i))
        else:
            order = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        orders.append(order)
    return orders


def ideal_timeline(orders, forward_times, backward_times) -> list[Event]:
    """Run every stage's ``orders`` as early as the data allows, each forward taking
    ``forward_times[stage]`` and each backward ``backward_times[stage]``, sending costing nothing.

    A forward needs the previous stage's forward of the same micro-batch; a backward needs the next
    stage's backward of it (the last stage: its own forward).
    """
    num_stages = len(orders)
    done: dict[tuple[int, str, int], float] = {}
    clock, position, events = [0.0] * num_stages, [0] * num_stages, []
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                kind, mb = orders[s][position[s]]
                needs = ((s - 1, "F", mb) if kind == "F" and s > 0 else
                         (s + 1, "B", mb) if kind == "B" and s < num_stages - 1 else
                         (s, "F", mb) if kind == "B" else None)
                if needs is not None and needs not in done:
                    break
                start = max(clock[s], done.get(needs, 0.0))
                clock[s] = done[(s, kind, mb)] = start + (forward_times if kind == "F" else backward_times)[s]
                events.append(Event(s, mb, PHASE[kind], start, clock[s]))
                position[s] += 1
                progressed = True
        if not progressed:
            raise ConfigError("these stage orders wait on each other forever (a deadlock).")
    return sorted(events, key=lambda e: (e.stage, e.start))


def compare_schedules(cluster, model, x: torch.Tensor, y: torch.Tensor, num_microbatches: int = 4, *,
                      steps: int = 2, rounds: int = 1, schedules=KINDS,
                      timeout: float | None = None, **options) -> dict[str, ScheduleRun]:
    """Every schedule on the same batch and micro-batches: RPC through ``model`` (a
    ``PipelineModel``), GPipe and 1F1B on the 2-rank ``cluster``.

    Each round runs every schedule in turn for one warm-up step and ``steps`` timed steps, so a
    machine that gets busier or quieter affects all of them alike. The result keeps the last
    round's gradients and timeline and the timed steps of every round. ``options`` go to
    ``train_step`` (``cut`` and ``seed`` must be the RPC model's).
    """
    if steps < 1 or rounds < 1:
        raise ConfigError(f"steps and rounds must be at least 1, got steps={steps}, rounds={rounds}.")
    for schedule in schedules:
        if schedule not in KINDS:
            raise ConfigError(f"unknown schedule {schedule!r}; choose from {', '.join(KINDS)}.")
    if "rpc" in schedules:
        for name in ("cut", "seed"):
            if name in options and options[name] != getattr(model, name):
                raise ConfigError(f"{name}={options[name]!r} differs from the RPC model's "
                                  f"{getattr(model, name)!r}: compare the same shards.")
            options.setdefault(name, getattr(model, name))
    runs: dict[str, ScheduleRun] = {}
    timed: dict[str, list[float]] = {schedule: [] for schedule in schedules}
    for _ in range(rounds):
        for schedule in schedules:
            if schedule == "rpc":
                run = rpc_step(model, x, y, num_microbatches, steps=steps + 1)
            else:
                run = run_schedule(cluster, x, y, schedule, num_microbatches=num_microbatches,
                                   steps=steps + 1, timeout=timeout, **options)
            timed[schedule] += run.step_times[1:]
            runs[schedule] = run
    for schedule, run in runs.items():
        run.step_times, run.warmup_steps = timed[schedule], 0
    return runs


COLUMNS = ("schedule", "s / step", "vs rpc", "idle: measured", "bubble model", "equal stages",
           "activations stage 1", "activations stage 2")


def table_rows(runs: dict[str, ScheduleRun]) -> list[list[str]]:
    """One row per run: time per step; the stages' idle share measured, in the bubble model with
    the measured stage times, and for equal stages ``(S-1)/(m+S-1)``; activation peaks per stage."""
    base = runs["rpc"].step_time if "rpc" in runs else None
    rows = []
    for name, run in runs.items():
        peaks = run.peak_activation_bytes or [None] * run.num_stages
        equal = bubble_fraction(run.num_stages, run.num_microbatches)
        rows.append([name, f"{run.step_time:.3f}", "-" if base is None else f"{run.step_time / base:.2f}x",
                     f"{run.idle_share():.0%}", f"{run.prediction().bubble:.0%}", f"{equal:.0%}",
                     *("not measured" if p is None else f"{p / 2**20:.1f} MiB" for p in peaks)])
    return rows


def format_table(runs: dict[str, ScheduleRun]) -> str:
    rows = [list(COLUMNS), *table_rows(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def plot_timelines(runs: dict[str, ScheduleRun]):
    """For every run: the measured last step (left) beside its bubble model (right), same scale."""
    import matplotlib.pyplot as plt

    from ppkit.pipeline.plots import plot_gantt

    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 2.2 * len(runs)), squeeze=False,
                             layout="constrained")
    for row, (name, run) in zip(axes, runs.items()):
        start = min(e.start for e in run.timeline.events)
        measured = [Event(e.stage, e.microbatch, e.phase, e.start - start, e.end - start)
                    for e in run.timeline.events]
        model = run.prediction()
        xlim = max(model.total, *(e.end for e in measured))
        plot_gantt(row[0], measured, run.timeline.labels,
                   f"{name}: measured step, {run.timeline.span():.2f} s, idle {run.idle_share():.0%}", xlim)
        plot_gantt(row[1], model.schedule, run.timeline.labels,
                   f"{name}: bubble model, {model.total:.2f} s, idle {model.bubble:.0%}", xlim)
    return fig
