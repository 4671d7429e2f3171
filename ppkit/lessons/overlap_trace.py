"""Lesson 10b's measuring: one step under ``torch.profiler`` on each rank, and what its timeline says.

A step to measure runs inside ``measured_step()`` (a ``record_function`` span), so the same analysis finds
it in a trace of this module's ``profile_step`` and in a whole-run ``cluster.profile()`` or
``ppkit.spawn(..., profile=True)``. Events are ``Profile.events()``'s dicts: ``name, rank, tid, start_us,
dur_us, kind`` (``"compute"`` or ``"communication"``) and ``args``.

    breakdown(events, rank)   the step's time on that rank: compute, communication, how much of the
                              communication overlapped compute, and idle time

The lesson's ranks are CPU ranks (gloo), where the step thread's ops are the compute. On a GPU they would
only be launches: there ``Profile.summary()`` sums a rank up in GPU time, kernels against NCCL's.
"""

from __future__ import annotations

from contextlib import contextmanager

from ppkit.profiling.summary import async_records, intersection, length, union

STEP = "overlap: measured step"
REPEATS = 3  # measured steps per profile: the analysis reads the median one


@contextmanager
def measured_step():
    """Mark the step to measure (on every rank) in whatever profiler records it."""
    from torch.profiler import record_function

    with record_function(STEP):
        yield


def profile_step(rank: int, step, warmup: int = 2, repeats: int = REPEATS, own_profiler: bool = True) -> dict | None:
    """Run ``step()`` ``warmup`` times, then ``repeats`` times, each inside ``measured_step``, under
    torch.profiler (ppkit's, as ``ppkit.spawn(..., profile=True)`` runs it); return this rank's trace for
    ``merged``. ``own_profiler=False`` when a profiler already records this rank (``cluster.profile()``):
    None is returned, that profile holds the steps. ``breakdown`` reads the step of median length."""
    import torch.distributed as dist

    from ppkit.profiling import collect

    def measured():
        for _ in range(repeats):
            with measured_step():
                step()

    for _ in range(warmup):
        step()
    dist.barrier()
    if not own_profiler:
        measured()
        return None
    result = collect.profiled(measured, collect.Request())
    return {key: value for key, value in result.items() if key != "events"}  # any EventList stays here


def merged(traces):
    """The ranks' traces from ``profile_step`` (by rank) as one ``ppkit.Profile``, on one clock."""
    from ppkit.profiling.profile import Profile

    return Profile.from_results(list(traces))


# -- intervals ---------------------------------------------------------------------------------------------

def subtract(a, b) -> list[tuple[float, float]]:
    """What of ``a`` lies outside ``b`` (both any (start, end) spans)."""
    out, b = [], union(b)
    for s, e in union(a):
        cut = intersection([(s, e)], b)
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


def spans(events, rank: int) -> dict:
    """The measured step's ``window`` on ``rank`` and, as unions of (start, end) in microseconds, its
    ``compute`` (the step thread's aten ops outside communication calls) and ``comm`` (any thread's). A
    ``gloo:send`` running from isend to wait() is no call: the ops beside it count (``async_records``)."""
    step = step_span(events, rank)
    window = _window(events, rank)
    main = step["tid"]
    unframed = {id(e) for e in async_records([e for e in events if e["rank"] == rank and e["tid"] == main])}
    main_comm = _spans(events, rank, window, lambda e: e["kind"] == "communication" and e["tid"] == main
                       and id(e) not in unframed)
    aten = _spans(events, rank, window, lambda e: e["tid"] == main and e["kind"] == "compute"
                  and e["name"].startswith("aten::"))
    return {"window": window, "compute": subtract(aten, main_comm), "comm": union(comm_spans(events, rank, window))}


def breakdown(events, rank: int) -> dict:
    """Milliseconds of the measured step on ``rank``: ``step``; ``compute``; ``comm``; ``overlapped``,
    communication while compute ran; ``exposed``, communication while the step's thread computed nothing
    (it waited); ``idle``, neither compute nor communication. (What counts as each: ``spans``.)"""
    s = spans(events, rank)
    comm, compute = s["comm"], s["compute"]
    overlapped = length(intersection(comm, compute))
    out = {"step": s["window"][1] - s["window"][0], "compute": length(compute), "comm": length(comm),
           "overlapped": overlapped, "exposed": length(comm) - overlapped,
           "idle": length(subtract([s["window"]], compute + comm))}
    return {k: v / 1000 for k, v in out.items()}


def prefetched_all_gathers(events, rank: int, pass_type: str) -> list[str]:
    """The layers whose all-gather FSDP2 issued as a prefetch in the measured step on ``rank``, in order:
    each ``FSDP::all_gather (layer)`` span inside a ``FSDP::{pass_type}_prefetch for ...`` span
    (``pass_type`` "forward" or "backward"). A prefetch span with no all-gather inside did nothing."""
    s0, s1 = _window(events, rank)
    mine = [e for e in events if e["rank"] == rank and s0 <= e["start_us"] < s1]
    outer = [(e["tid"], e["start_us"], e["start_us"] + e["dur_us"]) for e in mine
             if e["name"].startswith(f"FSDP::{pass_type}_prefetch for ")]
    label = "FSDP::all_gather"  # then " (fqn)"; the root module's has no fqn
    inner = sorted((e for e in mine if e["name"] == label or e["name"].startswith(label + " (")),
                   key=lambda e: e["start_us"])
    return [e["name"][len(label) + 2:-1] for e in inner
            if any(tid == e["tid"] and a <= e["start_us"] < b for tid, a, b in outer)]


def collectives(events, rank: int, prefix: str = "gloo:") -> list[dict]:
    """The step's collectives on ``rank`` as the backend ran them (``gloo:all_reduce`` on gloo's own
    threads), in the order they started."""
    s0, s1 = _window(events, rank)
    found = [e for e in events if e["rank"] == rank and e["name"].startswith(prefix) and s0 <= e["start_us"] < s1]
    return sorted(found, key=lambda e: e["start_us"])
