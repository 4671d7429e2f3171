"""What one schedule measured, drawn per rank: any schedule, one stage per rank or two.

A rank is the resource (a GPU, here a core), so the bubble is idle time of ranks; with two stages
on a rank its row holds both stages' work. :class:`LoopedRun` keeps the last step's work per rank
and the schedule's plan, and replays that plan with the measured time of every piece of work
(``prediction``): the step it would take if sending and waiting cost nothing.

    run = compare.run_looped(cluster, x, y, "zbvzerobubble", num_microbatches=4, steps=3)
    run.step_time, run.idle_share(), run.predicted_idle_share()
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ppkit.pipeline.schedules import plan as plans
from ppkit.pipeline.schedules.bubble_model import schedule_orders
from ppkit.pipeline.schedules.plan import Op, Work


@dataclass
class LoopedRun:
    """Steps of one schedule on one batch: time per step, the last step's work on every rank."""

    schedule: str
    num_microbatches: int
    microbatch_size: int
    stage_ranks: list[int]  # the rank of each stage
    cuts: tuple[str, ...]  # where ResNet50 was cut into stages
    loss: float | None
    grads: list[dict] | None  # per stage, name -> gradient (last step)
    step_times: list[float]  # seconds, slowest rank, every step
    works: list[Work]  # the last step: what each rank computed, seconds since the step started
    plan: dict[int, list[Op]]  # each rank's order of work
    peak_activation_bytes: list[int]  # per rank
    warmup_steps: int = 1  # leading step_times that also set the pipeline up
    round_times: list[float] = field(default_factory=list)  # median per round (compare_looped)

    @property
    def num_ranks(self) -> int:
        return len(self.peak_activation_bytes)

    @property
    def num_stages(self) -> int:
        return len(self.stage_ranks)

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    @property
    def step_time(self) -> float:
        """Median seconds per step, without the warm-up steps (unless there is nothing else)."""
        return statistics.median(self.step_times[self.warmup_steps:] or self.step_times)

    def idle_share(self) -> float:
        """Measured: the share of ranks x (first start to last end) in which ranks computed nothing."""
        return plans.idle_share(self.works, self.num_ranks)

    def op_times(self) -> dict[tuple[int, str], float]:
        """Measured seconds per micro-batch of every (stage, kind), the mean over micro-batches."""
        times: dict[tuple[int, str], list[float]] = {}
        for work in self.works:
            times.setdefault((work.stage, work.kind), []).append(work.duration)
        return {key: sum(values) / len(values) for key, values in times.items()}

    def prediction(self) -> list[Work]:
        """The bubble model: this schedule's plan, every op taking its measured time, sends free."""
        return plans.simulate(self.plan, self.op_times())

    def predicted_span(self) -> float:
        return plans.span(self.prediction())

    def predicted_idle_share(self) -> float:
        return plans.idle_share(self.prediction(), self.num_ranks)

    def order(self, rank: int) -> list[Op]:
        """What ``rank`` ran, in the order it ran it (the last step)."""
        return [Op(w.stage, w.kind, w.microbatch) for w in sorted(self.works, key=lambda w: w.start)
                if w.rank == rank]


def one_stage_plan(schedule: str, num_ranks: int, num_microbatches: int) -> dict[int, list[Op]]:
    """GPipe's or 1F1B's plan, one stage per rank (``bubble_model.schedule_orders``, which the
    tests check against what torch runs)."""
    orders = schedule_orders(schedule, num_ranks, num_microbatches)
    return {rank: [Op(rank, kind, mb) for kind, mb in order] for rank, order in enumerate(orders)}


def merge_looped(ranks: list[dict]) -> LoopedRun:
    """One run from the per-rank results of ``stage.train_step`` (in rank order)."""
    origin = min(r["step_start"] for r in ranks)
    works = sorted((Work(r["rank"], stage, kind, mb, t0 - origin, t1 - origin)
                    for r in ranks for stage, kind, mb, t0, t1 in r["events"]), key=lambda w: (w.rank, w.start))
    first = ranks[0]
    stage_ranks = sorted((s, r["rank"]) for r in ranks for s in r["stages"])
    plan = first["plan"] or one_stage_plan(first["schedule"], len(ranks), first["num_microbatches"])
    grads = None
    if first["grads"] is not None:
        by_stage = {s: g for r in ranks for s, g in r["grads"].items()}
        grads = [by_stage[s] for s in sorted(by_stage)]
    loss = next((r["loss"] for r in ranks if r["loss"] is not None), None)
    return LoopedRun(
        first["schedule"], first["num_microbatches"], first["microbatch_size"], [rank for _, rank in stage_ranks],
        tuple(first["cuts"]), loss, grads, [max(times) for times in zip(*(r["step_times"] for r in ranks))],
        works, plan, [r["peak_activation_bytes"] for r in ranks])
