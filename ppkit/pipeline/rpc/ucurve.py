"""The U-curve: for one batch, the training step time over the number of micro-batches.

    curve = measure_ucurve(model, optimizer, config, counts=(1, 2, 4, 8, 16, 32))
    print(curve.format_table())
    print(curve.summary())   # speed-up over no overlap at the same micro-batch size: 1.45x (...)

Two no-overlap references. The *whole-batch* one is the same shards with the same per-stage
resources and the whole batch as one micro-batch: its timeline shows each stage's time alone
(``f_s`` forward, ``b_s`` backward) and the step's other work (loss, optimizer, messages). The
*same-size* one (``ppkit.pipeline.rpc.no_overlap``, measured for every count unless ``same_size=False``)
runs the very micro-batches of each count one after the other. The pipelined step over the same-size
reference is the gain from overlap alone; the whole-batch reference over the same-size one is what
the micro-batch size did to the cost per image; the speed-up over the whole batch is their product.

The *bubble bound* for ``m`` micro-batches assumes each stage needs exactly ``f_s / m`` and ``b_s / m``
per micro-batch: the rest of the step plus the ideal GPipe schedule of :mod:`ppkit.pipeline.bubble`.
The *overlap bound* builds that ideal schedule from the same-size reference's own stage times, so it
holds whatever the micro-batch size does to the cost per image. The measured step falls with ``m``,
then rises: every micro-batch costs something of its own (messages, smaller kernels, one more
gradient accumulation). The fit ``measured - bound = overhead * (m - 1)`` states that cost, and
``bound + overhead * (m - 1)`` predicts the bottom of the U.

Steps are measured in rounds (one step at every count per round, after one untimed warm-up step
each; the same-size reference right after its count's step), alternating the order, so a machine
that gets busier meanwhile slows every count alike; a count's step time is the median of its rounds
(the lower of the two middle ones for an even number).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ppkit.errors import ConfigError
from ppkit.pipeline.bubble import predict
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.rpc.no_overlap import overlap_bound, train_no_overlap
from ppkit.pipeline.rpc.sweep import RunResult, train_batches

DEFAULT_COUNTS = (1, 2, 4, 8, 16, 32)


def default_counts(batch_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the batch size (at most 32), and the batch size if that is below 32."""
    return tuple(m for m in DEFAULT_COUNTS if m <= batch_size)


def sizes_for_counts(batch_size: int, counts) -> list[tuple[int, int]]:
    """``(num_microbatches, microbatch_size)`` per count, sorted, with 1 (the reference) included."""
    pairs = {}
    for m in sorted({1, *counts}):
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= batch_size:
            raise ConfigError(f"number of micro-batches {m!r} does not fit a batch of {batch_size}: "
                              f"choose whole numbers from 1 (no overlap) to {batch_size} (one image each).")
        size = math.ceil(batch_size / m)
        if math.ceil(batch_size / size) != m:
            raise ConfigError(
                f"a batch of {batch_size} cannot be cut into {m} micro-batches of one size: size "
                f"{size} gives {math.ceil(batch_size / size)}. Choose a count that divides "
                f"{batch_size}, e.g. {', '.join(str(d) for d in range(1, batch_size + 1) if batch_size % d == 0)}.")
        pairs[m] = size
    return sorted(pairs.items())


def step_model(forward, backward, fixed_seconds: float, overhead_seconds: float, m: int) -> float:
    """Predicted step time with ``m`` micro-batches: the bubble bound plus ``overhead * (m - 1)``.

    ``forward[s]``, ``backward[s]``: stage ``s`` alone on the whole batch; ``fixed_seconds``: the
    rest of a step (loss, optimizer, messages), which micro-batches do not change.
    """
    ideal = predict([f / m for f in forward], [b / m for b in backward], m).total
    return fixed_seconds + ideal + overhead_seconds * (m - 1)


def best_count(forward, backward, fixed_seconds: float, overhead_seconds: float, counts) -> int:
    """The count in ``counts`` with the smallest :func:`step_model` time (the smaller on a tie)."""
    return min(sorted(counts), key=lambda m: step_model(forward, backward, fixed_seconds,
                                                          overhead_seconds, m))


@dataclass
class Reference:
    """The no-overlap step: its time and each stage's time alone, for the whole batch."""

    step_seconds: float
    forward: tuple[float, ...]
    backward: tuple[float, ...]

    @property
    def stage_seconds(self) -> list[float]:
        return [f + b for f, b in zip(self.forward, self.backward, strict=True)]

    @property
    def fixed_seconds(self) -> float:
        """What a step spends outside the stages' compute: loss, optimizer, messages."""
        return max(0.0, self.step_seconds - sum(self.stage_seconds))

    def bound_seconds(self, m: int) -> float:
        return step_model(self.forward, self.backward, self.fixed_seconds, 0.0, m)

    def bound_speedup(self, m: int) -> float:
        return self.step_seconds / self.bound_seconds(m)

    def describe(self) -> str:
        stages = ", ".join(f"stage {s + 1} {f + b:.3f} s ({f:.3f} fwd + {b:.3f} bwd)"
                           for s, (f, b) in enumerate(zip(self.forward, self.backward, strict=True)))
        return (f"each stage alone on the whole batch: {stages}; the rest of a step (loss, optimizer, "
                f"messages) {self.fixed_seconds:.3f} s")


@dataclass
class CurvePoint:
    num_microbatches: int
    microbatch_size: int
    step_seconds: list[float] = field(default_factory=list)  # one per round
    run: RunResult | None = None  # the last round (timeline and bubble model of that step)
    no_overlap_seconds: list[float] = field(default_factory=list)  # the same micro-batches one at a time
    no_overlap_run: RunResult | None = None

    @property
    def seconds(self) -> float:
        """The median of the rounds (the lower middle one for an even count: a measured step)."""
        return statistics.median_low(self.step_seconds)

    @property
    def no_overlap(self) -> float | None:
        """The same-size reference's step time (median of the rounds), if it was measured."""
        return statistics.median_low(self.no_overlap_seconds) if self.no_overlap_seconds else None

    @property
    def overlap_speedup(self) -> float | None:
        """No overlap at this micro-batch size over pipelined: the gain from overlap alone."""
        return None if self.no_overlap is None else self.no_overlap / self.seconds


def fit_overhead(counts, measured, bound) -> float:
    """Least squares of ``measured - bound = overhead * (m - 1)`` over the counts above 1."""
    pairs = [(m - 1, t - b) for m, t, b in zip(counts, measured, bound, strict=True) if m > 1]
    denominator = sum(x * x for x, _ in pairs)
    return sum(x * y for x, y in pairs) / denominator if denominator else 0.0


COLUMNS = (
    ("num_microbatches", "micro-batches", "{}"),
    ("microbatch_size", "micro-batch size", "{}"),
    ("step_s", "s / step", "{:.3f}"),
    ("no_overlap_s", "no overlap s (same size)", "{:.3f}"),
    ("overlap_speedup", "speed-up over it", "{:.2f}x"),
    ("overlap_bound", "overlap bound", "{:.2f}x"),
    ("speedup", "vs whole batch", "{:.2f}x"),
    ("bound_s", "bubble bound s", "{:.3f}"),
    ("bound_speedup", "bound speed-up", "{:.2f}x"),
    ("model_s", "bound + overhead s", "{:.3f}"),
    ("measured_over_bound", "measured / bound", "{:.2f}"),
)


@dataclass
class UCurve:
    """Measured step times over micro-batch counts, with the reference, bound and overhead fit."""

    config: PipelineConfig
    cut: str
    reference: Reference
    points: list[CurvePoint]
    resources: list = field(default_factory=list)  # ProcessPlan per process

    @property
    def counts(self) -> list[int]:
        return [p.num_microbatches for p in self.points]

    @property
    def overhead_seconds(self) -> float:
        """Fitted cost of one more micro-batch, in seconds."""
        return fit_overhead(self.counts, [p.seconds for p in self.points],
                            [self.reference.bound_seconds(m) for m in self.counts])

    def model_seconds(self, m: int) -> float:
        ref = self.reference
        return step_model(ref.forward, ref.backward, ref.fixed_seconds, self.overhead_seconds, m)

    @property
    def best(self) -> CurvePoint:
        return min(self.points, key=lambda p: (p.seconds, p.num_microbatches))

    @property
    def predicted_best(self) -> int:
        """The count the fitted model (bound + overhead) says is fastest."""
        ref = self.reference
        return best_count(ref.forward, ref.backward, ref.fixed_seconds, self.overhead_seconds, self.counts)

    def speedup(self, point: CurvePoint) -> float:
        return self.reference.step_seconds / point.seconds

    def overlap_bound(self, point: CurvePoint) -> float | None:
        """The most overlap could give at ``point``'s size: its same-size reference over the ideal
        pipeline of that reference's stage times plus the whole-batch step's rest (``no_overlap``)."""
        if point.num_microbatches == 1:
            return 1.0
        if point.no_overlap_run is None:
            return None
        return overlap_bound(point.no_overlap_run, self.reference.fixed_seconds)

    def rows(self) -> list[dict]:
        rows = []
        for p in self.points:
            bound = self.reference.bound_seconds(p.num_microbatches)
            rows.append({"num_microbatches": p.num_microbatches, "microbatch_size": p.microbatch_size,
                         "step_s": p.seconds, "no_overlap_s": p.no_overlap, "overlap_speedup": p.overlap_speedup,
                         "overlap_bound": self.overlap_bound(p), "speedup": self.speedup(p), "bound_s": bound,
                         "bound_speedup": self.reference.step_seconds / bound,
                         "model_s": self.model_seconds(p.num_microbatches),
                         "measured_over_bound": p.seconds / bound})
        return rows

    def format_table(self, markdown: bool = False) -> str:
        from ppkit.pipeline.rpc.sweep import format_table

        return format_table(self.rows(), COLUMNS, markdown)

    def overhead_line(self) -> str:
        return (f"per-micro-batch overhead: {self.overhead_seconds * 1e3:.1f} ms per micro-batch "
                "(fitted: measured = bubble bound + overhead x (m - 1)); with it the model's best is "
                f"{self.predicted_best} micro-batches, the measured best {self.best.num_microbatches}")

    def summary(self) -> str:
        """The one line a script reads: the best count's speed-up over no overlap at its own
        micro-batch size and its overlap bound (when measured), then over the whole batch in one
        micro-batch and its bubble bound, the count and the size."""
        best = self.best
        whole = (f"{self.speedup(best):.2f}x (bubble bound "
                 f"{self.reference.bound_speedup(best.num_microbatches):.2f}x, {best.num_microbatches} "
                 f"micro-batches of {best.microbatch_size})")
        bound = self.overlap_bound(best)
        if best.overlap_speedup is None or bound is None:
            return f"speed-up over no overlap: {whole}"
        return (f"speed-up over no overlap at the same micro-batch size: {best.overlap_speedup:.2f}x (overlap "
                f"bound {bound:.2f}x); over the whole batch in one: {whole}")


def reference_from(runs: list[RunResult]) -> Reference:
    """The reference from its rounds: the round with the median step time, so that the step and
    its stage times come from the same step (then the bound for one micro-batch is that step)."""
    run = sorted(runs, key=lambda r: r.seconds_per_batch)[(len(runs) - 1) // 2]
    stages = range(run.timeline.num_stages)
    return Reference(run.seconds_per_batch, tuple(run.timeline.busy(s, "forward") for s in stages),
                     tuple(run.timeline.busy(s, "backward") for s in stages))


def measure_ucurve(model, optimizer, config: PipelineConfig, counts=None, *, rounds: int | None = None,
                   warmup: int = 1, progress=None, same_size: bool = True) -> UCurve:
    """Measure the U-curve on ``model`` (built by ``sweep.build_model(config)``, left open).

    ``counts``: numbers of micro-batches (default 1, 2, 4, ... 32, up to the batch size; 1 is
    always measured: it is the reference). ``rounds``: timed steps per count (default
    ``config.num_batches``). ``same_size``: also time the no-overlap reference at every count's
    micro-batch size (one more step per count above 1 and round). ``progress(done, total)`` counts steps.
    """
    rounds = config.num_batches if rounds is None else rounds
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"rounds must be a whole number >= 1, got {rounds!r}.")
    pairs = sizes_for_counts(config.batch_size, default_counts(config.batch_size) if counts is None else counts)
    one = config.replace(num_batches=1, microbatch_sizes=tuple(size for _, size in pairs)).check()
    points = [CurvePoint(m, size) for m, size in pairs]
    reference_runs: list[RunResult] = []
    extra = sum(p.num_microbatches > 1 for p in points) if same_size else 0
    total, done = (warmup + rounds) * len(points) + rounds * extra, 0

    def step(point: CurvePoint, timed: bool) -> None:
        nonlocal done
        run = train_batches(model, optimizer, one, point.microbatch_size)
        if timed:
            point.step_seconds.append(run.seconds_per_batch)
            point.run = run
            if point.num_microbatches == 1:
                reference_runs.append(run)
                if same_size:  # one micro-batch: nothing overlaps, it is its own same-size reference
                    point.no_overlap_seconds.append(run.seconds_per_batch)
            elif same_size:
                alone = train_no_overlap(model, optimizer, one, point.microbatch_size)
                point.no_overlap_seconds.append(alone.seconds_per_batch)
                point.no_overlap_run = alone
                done += 1
        done += 1
        if progress is not None:
            progress(done, total)

    for _ in range(warmup):
        for point in points:
            step(point, timed=False)
    for r in range(rounds):
        for point in (points if r % 2 == 0 else reversed(points)):
            step(point, timed=True)
    return UCurve(config, model.cut, reference_from(reference_runs), points,
                  list(getattr(model, "resources", [])))
