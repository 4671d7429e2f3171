"""What one schedule measured on one batch: times per step, the last step's timeline, and what
the bubble model makes of the same stage times.

RPC, GPipe and 1F1B runs all end up as a ``ScheduleRun``, so one table and one drawing
(``ppkit.pipeline.schedules.report``) serve all three.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ppkit.errors import ConfigError
from ppkit.pipeline.bubble import BubblePrediction
from ppkit.pipeline.schedules.bubble_model import PHASE, ideal_timeline, schedule_orders
from ppkit.pipeline.timeline import Event, Timeline


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
    if any(len(r["stages"]) != 1 for r in ranks):
        raise ConfigError(f"{ranks[0]['schedule']} puts several stages on a rank; merge it with "
                          "ppkit.pipeline.schedules.looped_run.merge_looped.")
    events = sorted((Event(stage, mb, PHASE[kind], t0 - origin, t1 - origin)
                     for r in ranks for stage, kind, mb, t0, t1 in r["events"]), key=lambda e: (e.stage, e.start))
    first = ranks[0]
    labels = [f"stage {r['stage'] + 1} (rank {r['rank']})" for r in ranks]
    return ScheduleRun(
        first["schedule"], first["num_microbatches"], first["microbatch_size"], ranks[-1]["loss"],
        None if first["grads"] is None else [r["grads"][r["stage"]] for r in ranks],
        [max(times) for times in zip(*(r["step_times"] for r in ranks))],
        Timeline(events, labels, first["num_microbatches"]),
        [r["peak_activation_bytes"] for r in ranks])
