"""The bubble model: how long a GPipe schedule takes if only computation cost time.

With ``S`` stages, ``m`` micro-batches and a forward time ``f_s`` per micro-batch on stage ``s``,
micro-batch ``i`` can start on stage ``s`` once stage ``s`` finished micro-batch ``i - 1`` and
stage ``s - 1`` finished micro-batch ``i``. The forward pass then takes

    sum_s f_s + (m - 1) * max_s f_s

and the backward pass, which starts when every output is back, the same with ``b_s``. With equal
stages the idle share of the stages (the *bubble*) is ``(S - 1) / (m + S - 1)``: more, smaller
micro-batches shrink it, until per-micro-batch overheads (RPC, small kernels) win. The model
ignores communication and contention, so measured time above it is exactly what those cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppkit.errors import ConfigError
from ppkit.pipeline.timeline import Event, Timeline


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """Idle share of a pipeline with equal stages: ``(S - 1) / (m + S - 1)``."""
    if num_stages < 1 or num_microbatches < 1:
        raise ConfigError("the bubble needs at least one stage and one micro-batch.")
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


@dataclass
class BubblePrediction:
    forward_times: list[float]  # per micro-batch, per stage
    backward_times: list[float]
    num_microbatches: int
    forward_span: float
    backward_span: float
    schedule: list[Event]  # the ideal schedule, drawable like a measured timeline

    @property
    def num_stages(self) -> int:
        return len(self.forward_times)

    @property
    def total(self) -> float:
        return self.forward_span + self.backward_span

    @property
    def bubble(self) -> float:
        """Idle share of the stages in the ideal schedule."""
        busy = self.num_microbatches * (sum(self.forward_times) + sum(self.backward_times))
        return 1.0 - busy / (self.num_stages * self.total) if self.total > 0 else 0.0

    @property
    def sequential(self) -> float:
        """The same work with no overlap at all (one micro-batch on one stage at a time)."""
        return self.num_microbatches * (sum(self.forward_times) + sum(self.backward_times))


def predict(forward_times, backward_times, num_microbatches: int) -> BubblePrediction:
    """Simulate the ideal GPipe schedule from per-micro-batch stage times."""
    forward_times = [float(t) for t in forward_times]
    backward_times = [float(t) for t in backward_times] or [0.0] * len(forward_times)
    if len(backward_times) != len(forward_times):
        raise ConfigError("give one forward and one backward time per stage.")
    if num_microbatches < 1 or not forward_times:
        raise ConfigError("the bubble model needs at least one stage and one micro-batch.")
    stages, m = len(forward_times), num_microbatches
    schedule = []

    def run(order, times, phase, t0):
        ends = [[t0] * (m + 1) for _ in range(stages)]  # ends[s][i + 1]: micro-batch i done on s
        for previous, s in zip([None, *order], order):
            for i in range(m):
                start = max(ends[s][i], ends[previous][i + 1] if previous is not None else t0)
                ends[s][i + 1] = start + times[s]
                schedule.append(Event(s, i, phase, start, ends[s][i + 1]))
        return max(ends[s][m] for s in range(stages))

    forward_end = run(list(range(stages)), forward_times, "forward", 0.0)
    backward_end = forward_end
    if any(backward_times):
        backward_end = run(list(reversed(range(stages))), backward_times, "backward", forward_end)
    schedule.sort(key=lambda e: (e.stage, e.start))
    return BubblePrediction(forward_times, backward_times, m, forward_end, backward_end - forward_end,
                            schedule)


def predict_from_timeline(timeline: Timeline) -> BubblePrediction:
    """The ideal schedule for a measured batch, from its measured stage times."""
    stages = range(timeline.num_stages)
    return predict([timeline.stage_time(s, "forward") for s in stages],
                   [timeline.stage_time(s, "backward") for s in stages],
                   timeline.num_microbatches)


def closed_form(forward_times, backward_times, num_microbatches: int) -> float:
    """``sum f + (m - 1) max f + sum b + (m - 1) max b``: what :func:`predict` must agree with."""
    m = num_microbatches
    total = sum(forward_times) + (m - 1) * max(forward_times)
    if backward_times and any(backward_times):
        total += sum(backward_times) + (m - 1) * max(backward_times)
    return total
