"""The ranks' traces on one clock: each rank's events as plain dicts, and one Chrome trace of all.

torch writes a trace's times in microseconds after its ``baseTimeNanoseconds`` (the rank's wall
clock), to the nanosecond (three decimals). Here they become whole nanoseconds on the kernel's clock (a
rank on another machine has its measured offset taken off, clocks.py, rounded to a nanosecond), then
counted from the earliest op of any rank. Whole nanoseconds
keep each rank's nesting: a slice that ends where its parent ends still does (in float64 microseconds
since the epoch, 1.8e15, the step is 0.25 us, and slices crossed). The merged trace keeps torch's flow
events (``s``/``f``: forward to backward, CPU launch to GPU kernel) and instant events (``i``) on their rank.

With CUDA activity a trace also holds the GPU's events: their ``pid`` is the device and their ``tid``
the stream, numbers that could be a CPU thread's too. Each stream becomes a row of its own under the
rank, ``cuda:D stream S``, with a ``tid`` (``stream_tid``) no thread of a process can have."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from ppkit.profiling import classify, sizes

SKIPPED_CATEGORIES = {"Trace"}  # the profiler's own span of the whole recording
STREAM_TIDS = 1 << 40  # above any thread id of Linux (at most 2**22): a stream's row


def stream_tid(device: int, stream: int) -> int:
    """The merged ``tid`` of a GPU's stream."""
    return STREAM_TIDS + (device << 24) + stream


def is_stream(tid: int) -> bool:
    return tid >= STREAM_TIDS


MARKS = {"s", "f", "i", "I"}  # flow start and end, instant events (``I``: the older name)


@dataclass
class Merged:
    """Every rank's complete events (``ph == "X"``), ``start_ns`` (``start_us``) from the earliest of them;
    ``marks``: the flow and instant events, as torch wrote them, their ``ts`` replaced by ``start_ns`` (on
    the same clock: the profiler's own start mark comes before the first op, below 0)."""

    events: list[dict]
    threads: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, tid) -> the thread's name
    hosts: dict[int, str] = field(default_factory=dict)
    marks: list[dict] = field(default_factory=list)


def ns(us) -> int:
    """A time torch wrote in microseconds with three decimals, as whole nanoseconds, exactly: the shortest
    decimal that reads back as the float is the one torch wrote (exact below 2**43 us, 101 days; kineto's
    ``ts`` counts from a base floored to 3 months)."""
    return int(Decimal(repr(float(us))) * 1000) if not isinstance(us, int) else us * 1000


def absolute_ns(trace: dict, ts) -> int:
    """A trace's ``ts`` as nanoseconds of the rank's wall clock (since the epoch)."""
    return int(trace.get("baseTimeNanoseconds", 0)) + ns(ts)


def merge(results: dict[int, dict], offsets_us: dict[int, float]) -> Merged:
    """``results``: by rank, what collect.trace_of sent; ``offsets_us``: by rank, what to take off its
    times to put them on the kernel's clock (0 for a rank on the kernel's machine)."""
    events: list[dict] = []
    marks: list[dict] = []
    threads: dict[tuple[int, int], str] = {}
    world = max(results, default=-1) + 1
    for rank, result in sorted(results.items()):
        trace, offset = result["trace"], round(offsets_us.get(rank, 0.0) * 1000)
        devices = {raw.get("pid") for raw in trace.get("traceEvents", []) if raw.get("cat") in classify.GPU_CATEGORIES}
        for raw in trace.get("traceEvents", []):
            phase = raw.get("ph")
            if phase == "M" and raw.get("name") == "thread_name" and raw.get("pid") not in devices:
                tid = int(raw.get("tid", 0))
                main = tid == int(raw.get("pid", -1))  # the process's first thread: where the job runs
                threads[(rank, tid)] = "main" if main else _thread_label(raw.get("args", {}).get("name", ""))
            if phase in MARKS and "ts" in raw:
                marks.append(_mark(raw, rank, world, devices, absolute_ns(trace, raw["ts"]) - offset))
            if phase != "X" or raw.get("cat") in SKIPPED_CATEGORIES:
                continue
            name, args, tid = str(raw.get("name", "")), dict(raw.get("args", {})), int(raw.get("tid", 0))
            if raw.get("cat") in classify.GPU_CATEGORIES:
                device, stream = int(args.get("device", raw.get("pid", 0))), int(args.get("stream", tid))
                tid = stream_tid(device, stream)
                threads[(rank, tid)] = f"cuda:{device} stream {stream}"
            events.append({"name": name, "rank": rank, "tid": tid,
                           "start_ns": absolute_ns(trace, raw["ts"]) - offset, "dur_ns": ns(raw.get("dur", 0)),
                           "kind": classify.kind(name, raw.get("cat", "")),
                           "cat": raw.get("cat", ""), "args": args, "bytes": sizes.op_bytes(args),
                           "elements": sizes.elements(args)})
    zero = min((e["start_ns"] for e in events), default=min((m["start_ns"] for m in marks), default=0))
    for event in events:
        event["start_ns"] -= zero
        event["start_us"], event["dur_us"] = event["start_ns"] / 1000, event["dur_ns"] / 1000
    for mark in marks:
        mark["start_ns"] -= zero
    events.sort(key=lambda e: (e["rank"], e["tid"], e["start_ns"], -e["dur_ns"]))
    for rank, tid in {(e["rank"], e["tid"]) for e in events} - set(threads):
        threads[(rank, tid)] = f"thread {tid}"
    return Merged(events, threads, {rank: result.get("host", "") for rank, result in results.items()}, marks)


def _mark(raw: dict, rank: int, world: int, devices: set, start_ns: int) -> dict:
    """A flow or instant event on the merged trace's rows: a GPU's on its stream's row, a flow's ``id``
    made the rank's own (torch numbers each rank's flows from 1: rank 0's arrow must not end on rank 1)."""
    mark = {key: value for key, value in raw.items() if key != "ts"}
    mark["rank"], mark["start_ns"] = rank, start_ns
    tid = raw.get("tid")
    if raw.get("pid") in devices and isinstance(tid, int):
        mark["tid"] = stream_tid(int(raw["pid"]), tid)
    elif not isinstance(tid, int):
        mark["tid"] = 0  # a global instant of the profiler's ("Record Window End")
    if "id" in raw and isinstance(raw["id"], int):
        mark["id"] = raw["id"] * world + rank
    return mark


def _thread_label(name: str) -> str:
    """torch's ``thread 124 (pt_gloo_runloop)`` as ``pt_gloo_runloop``."""
    inner = name[name.find("(") + 1:name.rfind(")")] if "(" in name and name.endswith(")") else name
    return inner or name


def chrome_trace(merged: Merged) -> dict:
    """One Chrome-trace / Perfetto JSON: pid = rank (named ``rank N``), tid = the rank's thread."""
    meta = []
    for rank in sorted({e["rank"] for e in merged.events} | set(merged.hosts)):
        host = merged.hosts.get(rank, "")
        meta.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                     "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
    for (rank, tid), name in sorted(merged.threads.items()):
        meta.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
    origin = min([0] + [m["start_ns"] for m in merged.marks])  # Perfetto drops a time below 0
    body = [{"ph": "X", "name": e["name"], "cat": e["cat"] or e["kind"], "pid": e["rank"], "tid": e["tid"],
             "ts": (e["start_ns"] - origin) / 1000, "dur": e["dur_ns"] / 1000,
             "args": {**e["args"], "kind": e["kind"], **({"bytes": e["bytes"]} if e["bytes"] else {})}}
            for e in merged.events]
    marks = [{**{k: v for k, v in m.items() if k not in ("rank", "start_ns")}, "pid": m["rank"],
              "ts": (m["start_ns"] - origin) / 1000} for m in merged.marks]
    return {"traceEvents": meta + body + marks, "displayTimeUnit": "ms",
            "otherData": {"producer": "ppkit", "clock": "the kernel's, ranks' offsets applied (docs/profiling.md)"}}
