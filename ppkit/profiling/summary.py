"""Per rank: compute, communication, how much of it overlapped compute, idle, and the top ops.

Compute is the operators' own time (each op's span less its children's: ``aten::linear``'s dispatch,
``aten::mm``'s matmul), outside every collective. A span that encloses a collective is no compute of its
own: a learner's ``record_function`` label, ``DistributedDataParallel.forward`` or a schedule's
``ProfilerStep#N`` (labels, which count only through the ops inside them) and autograd's
``evaluate_function`` around a hook that runs an all_reduce would otherwise cover the time the thread
waits for it, and call a blocking all_reduce hidden. Communication is every collective's span, on
any thread. Times are unions of intervals, so ops of several threads at once count once. Communication
that overlaps compute is the part of the communication intervals during which some compute ran too: the
hidden part. Idle is the rank's span (first op's start to last op's end) in which neither ran (Python
between ops included). Top ops: by self time (an op's own time, its children's taken off), the
profiler's usual ranking.

On a GPU the CPU only launches kernels and then waits, so a rank whose collectives ran as kernels on
its GPU (NCCL's) is summed up in GPU time: compute is its compute kernels, communication NCCL's kernels
(on their own stream), overlapped the time both ran, the span from its first GPU event to its last (copies and memsets
included, counted as neither), and the top ops its kernels (``measured_on``: "GPU" or "CPU"). A rank
with kernels but no communication kernel (a stray kernel, or CUDA tensors sent through gloo) keeps its CPU
time, where its collectives are."""

from __future__ import annotations

import html
from collections import defaultdict

from ppkit.profiling.classify import BACKEND_SPANS, COMMUNICATION, COMPUTE, GPU_CATEGORIES, LABELS

TOP = 5
COLUMNS = ("rank", "span_ms", "compute_ms", "communication_ms", "overlapped_ms", "overlap_pct", "idle_ms", "top_ops",
           "measured_on")


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint (start, end) intervals covering ``intervals``."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def length(intervals) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a, b) -> list[tuple[float, float]]:
    """The overlap of two sorted, disjoint interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def self_times(events: list[dict]) -> dict[str, float]:
    """Microseconds by op name, each op's children on its thread taken off."""
    totals: dict[str, float] = defaultdict(float)
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        by_thread[(event["rank"], event["tid"])].append(event)
    for thread in by_thread.values():
        stack: list[list] = []  # [event, end, children's time]
        for event in sorted(thread, key=lambda e: (e["start_us"], -e["dur_us"])):
            end = event["start_us"] + event["dur_us"]
            while stack and stack[-1][1] <= event["start_us"]:
                _close(stack.pop(), totals)
            if stack:
                stack[-1][2] += event["dur_us"]
            stack.append([event, end, 0.0])
        while stack:
            _close(stack.pop(), totals)
    return dict(totals)


def _close(entry: list, totals: dict) -> None:
    event, _, children = entry
    totals[event["name"]] += max(0.0, event["dur_us"] - children)


OPERATOR_CATEGORIES = {"cpu_op"}  # torch's operators; a user_annotation is a label (gloo's ops are named ones)
NOT_NESTING = {"python_function"}  # Python frames (with_stack) around and inside ops: no work of their own


def async_records(events: list[dict]) -> list[dict]:
    """The backend's spans that are no call frame: a ``gloo:send`` or ``nccl:all_reduce`` that the op
    launching it (``c10d::send``) starts on the calling thread and ``wait()`` ends, later. Such a span
    outlives the op it starts in, and whatever the thread ran meanwhile (the matmuls beside an isend) is
    not inside it. On gloo's own thread a ``gloo:all_reduce`` starts inside nothing: a call frame, whose
    copies are the collective's work."""
    found: list[dict] = []
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        if event.get("cat") not in NOT_NESTING:
            by_thread[(event["rank"], event["tid"])].append(event)
    for thread in by_thread.values():
        ends: list[float] = []  # the open call frames' ends, innermost last
        for event in sorted(thread, key=lambda e: (e["start_us"], -e["dur_us"])):
            end = event["start_us"] + event["dur_us"]
            while ends and ends[-1] <= event["start_us"]:
                ends.pop()
            if (event.get("cat") == LABELS and event["name"].startswith(BACKEND_SPANS) and ends
                    and ends[-1] < end):
                found.append(event)
            else:
                ends.append(end)
    return found


def compute_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """When the rank computed: each operator's own time (its span less its children's), for the operators
    that are neither inside a collective (gloo's own copies are communication's work) nor around one (an
    ``evaluate_function`` whose hook launched or waited for an all_reduce). Labels count through their ops,
    and a backend's span that is no call frame (``async_records``) holds none."""
    chosen: list[tuple[float, float]] = []
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    unframed = {id(event) for event in async_records(events)}
    for event in events:
        if event.get("cat") not in NOT_NESTING and id(event) not in unframed:
            by_thread[(event["rank"], event["tid"])].append(event)
    for thread in by_thread.values():
        stack: list[list] = []  # [event, end, children's (start, end), holds a collective]
        for event in sorted(thread, key=lambda e: (e["start_us"], -e["dur_us"])):
            end = event["start_us"] + event["dur_us"]
            while stack and stack[-1][1] <= event["start_us"]:
                _close_op(stack.pop(), stack, chosen)
            if stack:
                stack[-1][2].append((event["start_us"], end))
            stack.append([event, end, [], False])
        while stack:
            _close_op(stack.pop(), stack, chosen)
    return union(chosen)


def _close_op(entry: list, ancestors: list[list], chosen: list) -> None:
    event, end, children, holds_collective = entry
    collective = event["kind"] == COMMUNICATION
    if ancestors and (collective or holds_collective):
        ancestors[-1][3] = True
    if (collective or holds_collective or event.get("cat") not in OPERATOR_CATEGORIES
            or any(a[0]["kind"] == COMMUNICATION for a in ancestors)):
        return
    at = event["start_us"]
    for start, stop in union(children):
        if start > at:
            chosen.append((at, start))
        at = max(at, stop)
    if end > at:
        chosen.append((at, end))


def _intervals(events) -> list[tuple[float, float]]:
    return union((e["start_us"], e["start_us"] + e["dur_us"]) for e in events)


def rank_row(rank: int, events: list[dict]) -> dict:
    kernels = [e for e in events if e.get("cat") == "kernel"]
    on_gpu = any(e["kind"] == COMMUNICATION for e in kernels)  # NCCL's kernels: the collectives ran there
    if on_gpu:  # GPU time: the CPU's ops are launches and waits
        events = [e for e in events if e.get("cat") in GPU_CATEGORIES - {"gpu_user_annotation"}]
        spans = {k: _intervals(e for e in kernels if e["kind"] == k) for k in (COMPUTE, COMMUNICATION)}
    else:
        spans = {COMPUTE: compute_intervals(events),
                 COMMUNICATION: _intervals(e for e in events if e["kind"] == COMMUNICATION)}
    busy = union(spans[COMPUTE] + spans[COMMUNICATION])
    every = _intervals(events)
    span = (every[-1][1] - every[0][0]) if every else 0.0
    communication = length(spans[COMMUNICATION])
    overlapped = length(intersection(spans[COMPUTE], spans[COMMUNICATION]))
    top = sorted(self_times(events).items(), key=lambda item: -item[1])[:TOP]
    return {"rank": rank, "span_ms": span / 1000, "compute_ms": length(spans[COMPUTE]) / 1000,
            "communication_ms": communication / 1000, "overlapped_ms": overlapped / 1000,
            "overlap_pct": 100 * overlapped / communication if communication else 0.0,
            "idle_ms": (span - length(busy)) / 1000, "top_ops": [(name, us / 1000) for name, us in top],
            "measured_on": "GPU" if on_gpu else "CPU"}


class Summary:
    """``Profile.summary()``: one row per rank. ``.rows`` (a list of dicts), ``.to_pandas()``, and a
    table in the notebook. Times in milliseconds; ``top_ops``: (name, self time in ms), largest first."""

    def __init__(self, events: list[dict]):
        by_rank: dict[int, list[dict]] = defaultdict(list)
        for event in events:
            by_rank[event["rank"]].append(event)
        self.rows = [rank_row(rank, by_rank[rank]) for rank in sorted(by_rank)]

    def __getitem__(self, rank: int) -> dict:
        """The row of ``rank``."""
        for row in self.rows:
            if row["rank"] == rank:
                return row
        raise KeyError(f"no rank {rank} in this profile; its ranks are {[r['rank'] for r in self.rows]}")

    def to_pandas(self):
        """The rows as a pandas DataFrame indexed by rank (pandas must be installed)."""
        import pandas

        return pandas.DataFrame(self.rows).set_index("rank")

    def _cells(self, row: dict) -> list[str]:
        tops = ", ".join(f"{name} {ms:.2f}" for name, ms in row["top_ops"])
        return [str(row["rank"]), row["measured_on"], *(f"{row[c]:.2f}" for c in COLUMNS[1:5]),
                f"{row['overlap_pct']:.0f}%", f"{row['idle_ms']:.2f}", tops]

    def __repr__(self) -> str:
        heads = ["rank", "time of", "span ms", "compute ms", "comm ms", "overlapped ms", "overlap", "idle ms",
                 "top ops (self ms)"]
        lines = [heads] + [self._cells(row) for row in self.rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(heads) - 1)]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) + "  " + line[-1] for line in lines)

    def _repr_html_(self) -> str:
        heads = ["rank", "time of", "span (ms)", "compute (ms)", "communication (ms)", "overlapped with compute (ms)",
                 "overlap", "idle (ms)", "top ops (self ms)"]
        head = "".join(f"<th>{h}</th>" for h in heads)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in self._cells(row)) + "</tr>"
                       for row in self.rows)
        return f"<table class='ppkit-profile-summary'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
