"""Lesson 3b's measuring: one step under ``torch.profiler`` on each rank, and what its timeline says.

A step to measure runs inside ``measured_step()`` (a ``record_function`` span), so the same analysis finds
it in a trace of this module's ``profile_step`` and in a whole-run ``ppkit.spawn(..., profile=True)``.
Events are plain dicts, as ``Profile.events()`` gives them: ``name, rank, tid, start_us, dur_us, kind``
(``"compute"`` or ``"communication"``) and ``args``.

    breakdown(events, rank)   the step's time on that rank: compute, communication, how much of the
                              communication overlapped compute, and idle time
"""

from __future__ import annotations

from contextlib import contextmanager

STEP = "overlap: measured step"
REPEATS = 3  # measured steps per profile: the analysis reads the median one
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")


def kind_of(name: str) -> str:
    return "communication" if name.startswith(COMM_PREFIXES) else "compute"


@contextmanager
def measured_step():
    """Mark the step to measure (on every rank) in whatever profiler records it."""
    from torch.profiler import record_function

    with record_function(STEP):
        yield


def profile_step(rank: int, step, warmup: int = 2, repeats: int = REPEATS) -> list[dict]:
    """Run ``step()`` ``warmup`` times, then ``repeats`` times under torch.profiler, each inside
    ``measured_step``; return the events (``breakdown`` reads the step of median length). Times count from
    this rank's first measured step: the ranks meet at a barrier just before it, so on one machine they line
    up within a fraction of a millisecond (``ppkit.spawn(..., profile=True)`` aligns the ranks' clocks itself)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            with measured_step():
                step()
    events = [{"name": e.name, "rank": rank, "tid": int(e.thread), "start_us": float(e.time_range.start),
               "dur_us": float(e.time_range.elapsed_us()), "kind": kind_of(e.name), "args": {}}
              for e in prof.events()]
    t0 = min(e["start_us"] for e in events if e["name"] == STEP)
    for e in events:
        e["start_us"] -= t0
    return events


# -- intervals ---------------------------------------------------------------------------------------------

def union(spans) -> list[tuple[float, float]]:
    """Overlapping (start, end) spans merged: their union, sorted."""
    out: list[list[float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(spans) -> float:
    return sum(e - s for s, e in union(spans))


def intersect(a, b) -> list[tuple[float, float]]:
    a, b, out, i, j = union(a), union(b), [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b) -> list[tuple[float, float]]:
    """What of ``a`` lies outside ``b``."""
    out = []
    for s, e in union(a):
        cut = intersect([(s, e)], b)
        for cs, ce in cut:
            if cs > s:
                out.append((s, cs))
            s = ce
        if e > s:
            out.append((s, e))
    return out


# -- one step's breakdown ----------------------------------------------------------------------------------

def step_span(events, rank: int) -> dict:
    """The measured step of median length on ``rank`` (a shared machine makes some steps much slower)."""
    steps = sorted((e for e in events if e["rank"] == rank and e["name"] == STEP), key=lambda e: e["dur_us"])
    if not steps:
        raise ValueError(f"rank {rank}'s events hold no span named {STEP!r}: run the step to measure inside "
                         "ppkit.lessons.overlap_trace.measured_step() on every rank.")
    return steps[(len(steps) - 1) // 2]


def _spans(events, rank, window, keep):
    s0, s1 = window
    return [(max(e["start_us"], s0), min(e["start_us"] + e["dur_us"], s1)) for e in events
            if e["rank"] == rank and keep(e) and e["start_us"] < s1 and e["start_us"] + e["dur_us"] > s0]


def comm_spans(events, rank: int, window=None):
    window = window or _window(events, rank)
    return _spans(events, rank, window, lambda e: e["kind"] == "communication")


def _window(events, rank):
    step = step_span(events, rank)
    return step["start_us"], step["start_us"] + step["dur_us"]


def breakdown(events, rank: int) -> dict:
    """Milliseconds of the measured step on ``rank``: ``step``; ``compute``, the step thread's aten ops
    outside communication calls; ``comm``, any thread's communication; ``overlapped``, communication while
    compute ran; ``exposed``, communication while the step's thread computed nothing (it waited); ``idle``,
    neither compute nor communication."""
    step = step_span(events, rank)
    window = _window(events, rank)
    main = step["tid"]
    comm = comm_spans(events, rank, window)
    main_comm = _spans(events, rank, window, lambda e: e["kind"] == "communication" and e["tid"] == main)
    aten = _spans(events, rank, window, lambda e: e["tid"] == main and e["kind"] == "compute"
                  and e["name"].startswith("aten::"))
    compute = subtract(aten, main_comm)
    overlapped = length(intersect(comm, compute))
    out = {"step": step["dur_us"], "compute": length(compute), "comm": length(comm), "overlapped": overlapped,
           "exposed": length(comm) - overlapped, "idle": length(subtract([window], union(compute + comm)))}
    return {k: v / 1000 for k, v in out.items()}


def collectives(events, rank: int, prefix: str = "gloo:") -> list[dict]:
    """The step's collectives on ``rank`` as the backend ran them (``gloo:all_reduce`` on gloo's own
    threads), in the order they started."""
    s0, s1 = _window(events, rank)
    found = [e for e in events if e["rank"] == rank and e["name"].startswith(prefix) and s0 <= e["start_us"] < s1]
    return sorted(found, key=lambda e: e["start_us"])
