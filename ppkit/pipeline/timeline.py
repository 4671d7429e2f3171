"""Measured timelines: when each micro-batch's forward and backward ran on each stage.

Stages record wall-clock times (``time.time()``) in their own processes; on one machine those
clocks agree. Forward intervals on a stage never overlap (one compute thread per stage). Backward
intervals can: distributed autograd runs a process's backward on one engine thread that
interleaves the micro-batches whose gradients have arrived, so a stage's backward *busy* time is
the union of its intervals, not their sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PHASES = ("forward", "backward")


@dataclass(frozen=True)
class Event:
    stage: int
    microbatch: int
    phase: str  # "forward" or "backward"
    start: float  # seconds since the timeline's origin
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def union_length(intervals) -> float:
    """Total length covered by ``(start, end)`` intervals, overlaps counted once."""
    total, cover_end = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= cover_end:
            continue
        total += end - max(start, cover_end)
        cover_end = end
    return total


@dataclass
class Timeline:
    """Every stage's forward and backward intervals for one batch (one training step)."""

    events: list[Event]
    labels: list[str]
    num_microbatches: int
    origin: float = 0.0  # absolute time of t = 0 (the start of the batch on the driver)
    marks: dict[str, float] = field(default_factory=dict)  # driver-side moments, e.g. "optimizer"

    @classmethod
    def from_raw(cls, raw, labels, num_microbatches: int, origin: float, step: int | None = None,
                 marks: dict[str, float] | None = None) -> "Timeline":
        """Build from ``PipelineModel.drain_events()`` tuples, keeping only ``step`` if given."""
        events = [Event(stage, mb, phase, start - origin, end - origin)
                  for stage, event_step, mb, phase, start, end in raw
                  if step is None or event_step == step]
        events.sort(key=lambda e: (e.stage, e.start))
        marks = {name: t - origin for name, t in (marks or {}).items()}
        return cls(events, list(labels), num_microbatches, origin, marks)

    @property
    def num_stages(self) -> int:
        return len(self.labels)

    def select(self, stage: int | None = None, phase: str | None = None) -> list[Event]:
        return [e for e in self.events
                if (stage is None or e.stage == stage) and (phase is None or e.phase == phase)]

    def busy(self, stage: int, phase: str) -> float:
        """Seconds ``stage`` spent in ``phase`` (overlapping intervals counted once)."""
        return union_length((e.start, e.end) for e in self.select(stage, phase))

    def stage_time(self, stage: int, phase: str) -> float:
        """Measured time per micro-batch of ``stage`` in ``phase``: busy time / micro-batches."""
        count = len({e.microbatch for e in self.select(stage, phase)})
        return self.busy(stage, phase) / count if count else 0.0

    def span(self, phase: str | None = None) -> float:
        """From the first start to the last end (of ``phase`` if given)."""
        chosen = self.select(phase=phase)
        if not chosen:
            return 0.0
        return max(e.end for e in chosen) - min(e.start for e in chosen)

    def has_backward(self) -> bool:
        return any(e.phase == "backward" for e in self.events)
