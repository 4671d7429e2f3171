"""Whether a thread computes: its CPU time, read from another thread.

A rank's main thread inside a library (torch.nn's forward, autograd's backward) with a gloo call
pending is either computing, while gloo runs the call on its own threads (an overlap), or blocked in
a wait that C++ makes (DDP's reducer waits for its buckets inside autograd). Its frames read the same
either way; its CPU time does not: a thread blocked on a condition variable uses none (measured:
0.0 ms over 0.1 s, in gloo's wait and DDP's reducer), one computing uses it as the scheduler lets it.
"""

from __future__ import annotations

import threading
import time

SAMPLE_S = 0.1  # how long a rank's reader thread watches its main thread's CPU time
BUSY_SHARE = 0.02  # a thread that used more than this share of one core over a look is computing


def seconds(ident: int | None) -> float | None:
    """The CPU time the thread ``ident`` (threading.get_ident()) has used, in seconds; None where it cannot
    be read (the thread ended, or a platform without per-thread clocks)."""
    if ident is None:
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (AttributeError, OSError, OverflowError, ValueError):
        return None


def computed(before: float | None, after: float | None, wall_s: float) -> bool:
    """Whether a thread whose CPU time read ``before`` and then ``after``, ``wall_s`` seconds apart, computed."""
    return before is not None and after is not None and wall_s > 0 and after - before > BUSY_SHARE * wall_s


def computing(ident: int | None, sample_s: float = SAMPLE_S) -> bool | None:
    """Whether the thread ``ident`` uses CPU time over the next ``sample_s`` seconds; None where it cannot
    be told (no clock, or it is the calling thread, which would only see itself wait)."""
    if ident is None or ident == threading.get_ident():
        return None
    before, began = seconds(ident), time.monotonic()
    if before is None:
        return None
    time.sleep(sample_s)
    after = seconds(ident)
    return None if after is None else computed(before, after, time.monotonic() - began)
