"""Each rank's clock against the kernel's, measured over ppkit's channel as NTP does, rank by rank.

The kernel notes its clock (t0), asks every rank for its own in one small job, and notes its clock
again when the answers are in (t1). A rank read its clock (T) somewhere between t0 and t1, so its offset
lies in ``[T - t1, T - t0]``. One ping asks every rank at once, and t1 waits for the slowest, so one ping
alone bounds every rank by the same whole round trip. Several pings do better, rank by rank: each gives
an interval that holds the rank's offset, and so does their intersection, which is as narrow as the
latest of the rank's early answers and the earliest of its late ones allow. The offset is its middle,
the error bound half its width: the rank's own uncertainty. Where the intervals do not meet (a clock
stepped during the pings) the ping with the shortest round trip is kept, with half that as its bound.

Ranks that read one clock (one machine: one boot id, collect.clock_id) get one offset: the intersection
of their intervals (``shared``), applied to all of them or to none, so that two ranks of one machine are
never pulled apart by their measurements' noise. The kernel's own clock gets none, and an offset within its
bound is noise: not applied either (``Offset.applies``, profile.py); ``Profile.offsets`` keeps every
rank's own measurement."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ppkit.profiling import collect

PINGS = 8  # small jobs of a few ms each
PING_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Offset:
    """A rank's clock minus the kernel's, in microseconds, and its error bound: the offset is within
    ``error_us`` of the truth."""

    offset_us: float
    error_us: float

    def applies(self) -> bool:
        """Whether the offset says more than its uncertainty: only then is taking it off a correction."""
        return abs(self.offset_us) > self.error_us


def measure(run, pings: int = PINGS) -> dict[int, Offset]:
    """``run``: a function that runs a job on every rank and returns the values by rank (``cluster.run``)."""
    windows: dict[int, list[tuple[float, float]]] = {}  # rank: each ping's (lowest, highest) offset in µs
    for _ in range(pings):
        t0 = time.time_ns()
        stamps = run(collect.now_ns, timeout=PING_TIMEOUT_S)
        t1 = time.time_ns()
        for rank, stamp in enumerate(stamps):
            windows.setdefault(rank, []).append(((stamp - t1) / 1000, (stamp - t0) / 1000))
    return {rank: _bounded(intervals) for rank, intervals in windows.items()}


def shared(offsets: list[Offset]) -> Offset:
    """One offset for ranks that read the same clock: their intervals' intersection, as ``measure`` does
    with one rank's pings."""
    return _bounded([(o.offset_us - o.error_us, o.offset_us + o.error_us) for o in offsets])


def _bounded(intervals: list[tuple[float, float]]) -> Offset:
    low, high = max(lo for lo, _ in intervals), min(hi for _, hi in intervals)
    if low > high:  # no offset fits every ping: the clock moved; trust the tightest ping alone
        low, high = min(intervals, key=lambda interval: interval[1] - interval[0])
    return Offset((low + high) / 2, (high - low) / 2)
