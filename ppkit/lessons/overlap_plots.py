"""Lesson 10b's pictures: measured steps side by side, compute and communication per rank.

Each setting is one panel; each rank two rows: what its step thread computed (green) and when any of its
threads communicated (orange). Where an orange bar sits under a green one, the communication was hidden.
The same step in full detail, every op and thread with hover, is ``ppkit.spawn(..., profile=True)``'s
timeline; these panels draw only what the overlap numbers count, so that settings compare at a glance.
"""

from __future__ import annotations

from ppkit.lessons import overlap as ov
from ppkit.lessons import overlap_trace as ot
from ppkit.lessons.timeline import KIND_COLORS

ROWS = (("compute", KIND_COLORS["compute"]), ("comm", KIND_COLORS["comm"]))


def draw_step(ax, row: dict, ranks=(0, 1), xlim: float | None = None) -> None:
    """One measured setting (a sweep's row: ``setting``, ``events`` and the breakdown) on ``ax``."""
    labels = []
    for r in ranks:
        s = ot.spans(row["events"], r)
        t0 = s["window"][0]
        for kind, colour in ROWS:
            y = len(labels)
            ax.broken_barh([((a - t0) / 1000, (b - a) / 1000) for a, b in s[kind]], (y - 0.35, 0.7),
                           facecolors=colour)
            labels.append(f"rank {r} {'compute' if kind == 'compute' else 'communication'}")
        ax.axvline((s["window"][1] - t0) / 1000, color="#555", lw=0.8, ls=":")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, xlim or longest_step(row, ranks) * 1.02)
    ax.set_title(f"{row['setting']}, rank 0: step {row['step']:.0f} ms, communication {row['comm']:.0f} ms, "
                 f"{ov.overlap_fraction(row):.0%} of it beside compute", fontsize=9)


def longest_step(row: dict, ranks=(0, 1)) -> float:
    """The longest of the ranks' measured steps, in ms."""
    return max(ot.breakdown(row["events"], r)["step"] for r in ranks)


def plot_steps(rows, ranks=(0, 1)):
    """One panel per measured setting, on one time axis (ms from each rank's step start)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 1.1 + 1.05 * len(rows) * len(ranks) / 2 + 0.35 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 1, sharex=True, squeeze=False)[:, 0]
    longest = max(longest_step(r, ranks) for r in rows) * 1.02
    for ax, row in zip(axes, rows):
        draw_step(ax, row, ranks, longest)
    axes[-1].set_xlabel("ms from the step's start (the dotted line: its end)")
    return fig
