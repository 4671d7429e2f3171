"""A balanced cut: measure every candidate cut on this machine, keep the smallest slowest stage.

A pipeline runs no faster than its slowest stage, so the best cut is the one whose slowest stage
(forward + backward, whole batch, each stage alone) is smallest. FLOP counts do not say which one
that is on a CPU: late ResNet layers have few pixels and many weights, so their time depends on
the batch and on memory more than on arithmetic. So each cut is built and timed here.

    candidates = measure_cuts(config)       # an RPC world must be running
    print(format_candidates(candidates))
    config = config.replace(cut=pick(candidates).cut)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ppkit.errors import ConfigError
from ppkit.models.resnet import CUT_POINTS
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.rpc.sweep import build_model, format_table, train_batches


@dataclass
class CutCandidate:
    cut: str
    forward: tuple[float, ...]  # each stage alone, whole batch, seconds
    backward: tuple[float, ...]

    @property
    def stage_seconds(self) -> list[float]:
        return [f + b for f, b in zip(self.forward, self.backward, strict=True)]

    @property
    def slowest(self) -> float:
        return max(self.stage_seconds)

    @property
    def bound_speedup(self) -> float:
        """What pipelining could give at best with very many micro-batches: all stages / slowest."""
        return sum(self.stage_seconds) / self.slowest if self.slowest > 0 else 1.0


def pick(candidates: list[CutCandidate]) -> CutCandidate:
    """The candidate with the smallest slowest stage."""
    if not candidates:
        raise ConfigError("no cut was measured: give at least one candidate cut.")
    return min(candidates, key=lambda c: c.slowest)


def measure_cuts(config: PipelineConfig, cuts=CUT_POINTS, *, rounds: int = 2, progress=None
                 ) -> list[CutCandidate]:
    """Build the shards for every cut in ``cuts`` (with ``config``'s placement and stage resources),
    train one warm-up and ``rounds`` timed steps with the whole batch as one micro-batch, and take
    each stage's median forward and backward time."""
    candidates = []
    for n, cut in enumerate(cuts):
        model, optimizer = build_model(config.replace(cut=cut))
        one = config.replace(cut=cut, num_batches=1, microbatch_sizes=(config.batch_size,))
        try:
            train_batches(model, optimizer, one, config.batch_size)  # warm-up
            runs = [train_batches(model, optimizer, one, config.batch_size) for _ in range(rounds)]
        finally:
            model.close()
        stages = range(runs[0].timeline.num_stages)
        candidates.append(CutCandidate(
            cut, tuple(statistics.median(r.timeline.busy(s, "forward") for r in runs) for s in stages),
            tuple(statistics.median(r.timeline.busy(s, "backward") for r in runs) for s in stages)))
        if progress is not None:
            progress(n + 1, len(cuts))
    return candidates


COLUMNS = (
    ("cut", "cut after", "{}"),
    ("stage1_s", "stage 1 s", "{:.3f}"),
    ("stage2_s", "stage 2 s", "{:.3f}"),
    ("slowest_s", "slowest s", "{:.3f}"),
    ("bound", "bound speed-up (many micro-batches)", "{:.2f}x"),
    ("chosen", "", "{}"),
)


def format_candidates(candidates: list[CutCandidate], markdown: bool = False) -> str:
    chosen = pick(candidates)
    rows = [{"cut": c.cut, "stage1_s": c.stage_seconds[0], "stage2_s": c.stage_seconds[-1],
             "slowest_s": c.slowest, "bound": c.bound_speedup,
             "chosen": "<- chosen" if c is chosen else ""} for c in candidates]
    return "\n".join(line.rstrip() for line in format_table(rows, COLUMNS, markdown).splitlines())
