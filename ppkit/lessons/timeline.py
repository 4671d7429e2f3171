"""Measure what each rank did and when, then draw it and say who waited for whom.

Every rank records spans on ``time.monotonic()``, which on Linux is one clock for the whole
machine, so spans from different local processes line up. (Across machines they would not.)

    tl = Timeline(rank)
    with tl.span("work", kind="compute"):
        time.sleep(0.2)
    with tl.span("send", kind="comm", peer=1, phase="blocking"):
        dist.send(t, dst=1)
    return tl.spans          # from cluster.run: a list per rank
"""

from __future__ import annotations

import time
from contextlib import contextmanager

KIND_COLORS = {"compute": "#8fbc8f", "comm": "#e07b54", "post": "#7aa6d8", "idle": "#d9d9d9"}


class Timeline:
    """The spans one rank records. ``spans`` are plain dicts, so they travel back from workers."""

    def __init__(self, rank: int):
        self.rank = rank
        self.spans: list[dict] = []

    @contextmanager
    def span(self, label: str, kind: str = "compute", peer: int | None = None, phase: str = ""):
        start = time.monotonic()
        try:
            yield
        finally:
            self.spans.append({"rank": self.rank, "label": label, "kind": kind, "peer": peer,
                               "phase": phase, "start": start, "end": time.monotonic()})

    def mark(self, label: str, peer: int | None = None, phase: str = "") -> None:
        """An instant event, e.g. posting an irecv (it returns at once)."""
        now = time.monotonic()
        self.spans.append({"rank": self.rank, "label": label, "kind": "post", "peer": peer,
                           "phase": phase, "start": now, "end": now})


def flatten(spans_by_rank) -> list[dict]:
    """Spans from ``cluster.run`` (one list per rank) as one list, times relative to the first."""
    spans = [dict(s) for per_rank in spans_by_rank if per_rank for s in per_rank]
    if not spans:
        return []
    t0 = min(s["start"] for s in spans)
    for s in spans:
        s["start"] -= t0
        s["end"] -= t0
    return sorted(spans, key=lambda s: (s["start"], s["rank"]))


def who_waited(spans_by_rank, min_wait_s: float = 0.0) -> list[dict]:
    """For each blocking communication span: who was blocked, on whom, how long, and what the
    peer was doing meanwhile (the compute spans of the peer that overlap the wait)."""
    spans = flatten(spans_by_rank)
    found = []
    for s in spans:
        if s["kind"] != "comm" or s["end"] - s["start"] < min_wait_s:
            continue
        wait = s["end"] - s["start"]
        peer = s["peer"]
        if peer is None:  # a collective: everyone waits for the last rank to arrive
            same = [p for p in spans if p["kind"] == "comm" and p["phase"] == s["phase"]
                    and p["label"] == s["label"]]
            peer = max(same, key=lambda p: p["start"])["rank"]
            if peer == s["rank"]:
                continue  # the last to arrive waited for nobody
        peer_busy = [p for p in spans if p["rank"] == peer and p["kind"] == "compute"
                     and min(p["end"], s["end"]) - max(p["start"], s["start"]) > wait / 4]
        found.append({
            "phase": s["phase"], "rank": s["rank"], "call": s["label"], "peer": peer,
            "from_s": s["start"], "to_s": s["end"], "waited_s": wait,
            "peer_was": ", ".join(dict.fromkeys(p["label"] for p in peer_busy)) or "-",
        })
    return found


def describe(spans_by_rank, min_wait_s: float = 0.02) -> str:
    """One sentence per wait longer than ``min_wait_s``, phase by phase."""
    waits = who_waited(spans_by_rank, min_wait_s)
    phases = dict.fromkeys(s["phase"] for s in flatten(spans_by_rank))
    lines = []
    for phase in phases:
        label = f"[{phase}] " if phase else ""
        here = [w for w in waits if w["phase"] == phase]
        for w in here:
            doing = f" while rank {w['peer']} was busy with {w['peer_was']}" if w["peer_was"] != "-" else ""
            lines.append(f"{label}rank {w['rank']} waited {w['waited_s']:.2f} s in {w['call']} "
                         f"for rank {w['peer']}{doing}")
        if not here:
            lines.append(f"{label}nobody waited longer than {min_wait_s:.2f} s")
    return "\n".join(lines)


def plot(spans_by_rank, title: str = "who waited for whom"):
    """A Gantt chart: one row per rank, one bar per span. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    spans = flatten(spans_by_rank)
    ranks = sorted({s["rank"] for s in spans})
    phases = [p for p in dict.fromkeys(s["phase"] for s in spans) if p]
    fig = Figure(figsize=(9, 0.7 * len(ranks) + 1.3))
    ax = fig.add_subplot()
    for s in spans:
        y = ranks.index(s["rank"])
        if s["kind"] == "post":  # an instant: draw a tick and name it
            ax.plot([s["start"]] * 2, [y - 0.38, y + 0.38], color=KIND_COLORS["post"], linewidth=2.5)
            ax.text(s["start"], y - 0.4, s["label"], ha="center", va="bottom", fontsize=7,
                    color="#335f99")
            continue
        width = max(s["end"] - s["start"], 0.004)
        ax.barh(y, width, left=s["start"], height=0.6, color=KIND_COLORS.get(s["kind"], "#999"),
                edgecolor="black", linewidth=0.5)
        if s["end"] - s["start"] > 0.06:
            ax.text(s["start"] + width / 2, y, s["label"], ha="center", va="center", fontsize=8)
    for phase in phases:
        start = min(s["start"] for s in spans if s["phase"] == phase)
        ax.axvline(start, color="grey", linestyle=":", linewidth=0.8)
        ax.text(start, -0.5, f" {phase}", fontsize=8, color="grey", va="bottom")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.4, -0.75)  # rank 0 on top
    ax.set_xlabel("seconds since the first span")
    ax.set_title(title)
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in ("compute", "comm", "post")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    return fig
