"""The ranks' traces on one clock: each rank's events as plain dicts, and one Chrome trace of all.

torch writes a trace's times in microseconds after its ``baseTimeNanoseconds`` (the rank's wall
clock). Here they become microseconds on the kernel's clock (a rank on another machine has its
measured offset taken off, clocks.py), then counted from the earliest event of any rank.

With CUDA activity a trace also holds the GPU's events: their ``pid`` is the device and their ``tid``
the stream, numbers that could be a CPU thread's too. Each stream becomes a row of its own under the
rank, ``cuda:D stream S``, with a ``tid`` (``stream_tid``) no thread of a process can have."""

from __future__ import annotations

from dataclasses import dataclass, field

from ppkit.profiling import classify, sizes

SKIPPED_CATEGORIES = {"Trace"}  # the profiler's own span of the whole recording
STREAM_TIDS = 1 << 40  # above any thread id of Linux (at most 2**22): a stream's row


def stream_tid(device: int, stream: int) -> int:
    """The merged ``tid`` of a GPU's stream."""
    return STREAM_TIDS + (device << 24) + stream


def is_stream(tid: int) -> bool:
    return tid >= STREAM_TIDS


@dataclass
class Merged:
    """Every rank's complete events (``ph == "X"``), ``start_us`` from the earliest of them."""

    events: list[dict]
    threads: dict[tuple[int, int], str] = field(default_factory=dict)  # (rank, tid) -> the thread's name
    hosts: dict[int, str] = field(default_factory=dict)


def absolute_us(trace: dict, ts: float) -> float:
    """A trace's ``ts`` as microseconds of the rank's wall clock (since the epoch)."""
    return ts + trace.get("baseTimeNanoseconds", 0) / 1000


def merge(results: dict[int, dict], offsets_us: dict[int, float]) -> Merged:
    """``results``: by rank, what collect.trace_of sent; ``offsets_us``: by rank, what to take off its
    times to put them on the kernel's clock (0 for a rank on the kernel's machine)."""
    events: list[dict] = []
    threads: dict[tuple[int, int], str] = {}
    for rank, result in sorted(results.items()):
        trace, offset = result["trace"], offsets_us.get(rank, 0.0)
        devices = {raw.get("pid") for raw in trace.get("traceEvents", []) if raw.get("cat") in classify.GPU_CATEGORIES}
        for raw in trace.get("traceEvents", []):
            if raw.get("ph") == "M" and raw.get("name") == "thread_name" and raw.get("pid") not in devices:
                tid = int(raw.get("tid", 0))
                main = tid == int(raw.get("pid", -1))  # the process's first thread: where the job runs
                threads[(rank, tid)] = "main" if main else _thread_label(raw.get("args", {}).get("name", ""))
            if raw.get("ph") != "X" or raw.get("cat") in SKIPPED_CATEGORIES:
                continue
            name, args, tid = str(raw.get("name", "")), dict(raw.get("args", {})), int(raw.get("tid", 0))
            if raw.get("cat") in classify.GPU_CATEGORIES:
                device, stream = int(args.get("device", raw.get("pid", 0))), int(args.get("stream", tid))
                tid = stream_tid(device, stream)
                threads[(rank, tid)] = f"cuda:{device} stream {stream}"
            events.append({"name": name, "rank": rank, "tid": tid,
                           "start_us": absolute_us(trace, float(raw["ts"])) - offset,
                           "dur_us": float(raw.get("dur", 0.0)), "kind": classify.kind(name, raw.get("cat", "")),
                           "cat": raw.get("cat", ""), "args": args, "bytes": sizes.op_bytes(args),
                           "elements": sizes.elements(args)})
    zero = min((e["start_us"] for e in events), default=0.0)
    for event in events:
        event["start_us"] -= zero
    events.sort(key=lambda e: (e["rank"], e["tid"], e["start_us"], -e["dur_us"]))
    for rank, tid in {(e["rank"], e["tid"]) for e in events} - set(threads):
        threads[(rank, tid)] = f"thread {tid}"
    return Merged(events, threads, {rank: result.get("host", "") for rank, result in results.items()})


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
    body = [{"ph": "X", "name": e["name"], "cat": e["cat"] or e["kind"], "pid": e["rank"], "tid": e["tid"],
             "ts": round(e["start_us"], 3), "dur": round(e["dur_us"], 3),
             "args": {**e["args"], "kind": e["kind"], **({"bytes": e["bytes"]} if e["bytes"] else {})}}
            for e in merged.events]
    return {"traceEvents": meta + body, "displayTimeUnit": "ms",
            "otherData": {"producer": "ppkit", "clock": "the kernel's, ranks' offsets applied (docs/profiling.md)"}}
