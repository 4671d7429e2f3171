"""Each rank's clock against the kernel's, measured over ppkit's channel as NTP does.

The kernel notes its clock (t0), asks every rank for its own in one small job, and notes its clock
again when the answers are in (t1). A rank answered somewhere between t0 and t1, so its offset is
``rank_time - (t0 + t1) / 2``, within half the round trip. Of several pings the one with the shortest
round trip is kept: it bounds the error best. Ranks on the kernel's own machine share its clock:
their offset is measured (``Profile.offsets``) but not applied (merge.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ppkit.profiling import collect

PINGS = 5  # small jobs of a few ms each; the shortest round trip wins
PING_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Offset:
    """A rank's clock minus the kernel's, in microseconds, and the error bound (half the round trip)."""

    offset_us: float
    error_us: float


def measure(run, pings: int = PINGS) -> dict[int, Offset]:
    """``run``: a function that runs a job on every rank and returns the values by rank (``cluster.run``)."""
    best: dict[int, Offset] = {}
    for _ in range(pings):
        t0 = time.time_ns()
        stamps = run(collect.now_ns, timeout=PING_TIMEOUT_S)
        t1 = time.time_ns()
        for rank, stamp in enumerate(stamps):
            offset = Offset((stamp - (t0 + t1) / 2) / 1000, (t1 - t0) / 2000)
            if rank not in best or offset.error_us < best[rank].error_us:
                best[rank] = offset
    return best
