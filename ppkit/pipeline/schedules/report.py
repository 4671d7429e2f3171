"""RPC, GPipe and 1F1B side by side: one table row per schedule, and each measured timeline next
to its bubble model.

    print(format_table(runs)); plot_timelines(runs)   # runs: compare.compare_schedules(...)

The drawing is ``ppkit.pipeline``'s ``plot_gantt``, so the RPC pipeline and
torch.distributed.pipelining are drawn the same way.
"""

from __future__ import annotations

from ppkit.pipeline.bubble import bubble_fraction
from ppkit.pipeline.schedules.schedule_run import ScheduleRun
from ppkit.pipeline.timeline import Event

COLUMNS = ("schedule", "s / step", "vs rpc", "idle: measured", "bubble model", "equal stages",
           "activations stage 1", "activations stage 2")


def table_rows(runs: dict[str, ScheduleRun]) -> list[list[str]]:
    """One row per run: time per step; the stages' idle share measured, in the bubble model with
    the measured stage times, and for equal stages ``(S-1)/(m+S-1)``; activation peaks per stage."""
    base = runs["rpc"].step_time if "rpc" in runs else None
    rows = []
    for name, run in runs.items():
        peaks = run.peak_activation_bytes or [None] * run.num_stages
        equal = bubble_fraction(run.num_stages, run.num_microbatches)
        rows.append([name, f"{run.step_time:.3f}", "-" if base is None else f"{run.step_time / base:.2f}x",
                     f"{run.idle_share():.0%}", f"{run.prediction().bubble:.0%}", f"{equal:.0%}",
                     *("not measured" if p is None else f"{p / 2**20:.1f} MiB" for p in peaks)])
    return rows


def format_table(runs: dict[str, ScheduleRun]) -> str:
    rows = [list(COLUMNS), *table_rows(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def plot_timelines(runs: dict[str, ScheduleRun]):
    """For every run: the measured last step (left) beside its bubble model (right), same scale."""
    import matplotlib.pyplot as plt

    from ppkit.pipeline.plots import plot_gantt

    fig, axes = plt.subplots(len(runs), 2, figsize=(11, 2.2 * len(runs)), squeeze=False,
                             layout="constrained")
    for row, (name, run) in zip(axes, runs.items()):
        start = min(e.start for e in run.timeline.events)
        measured = [Event(e.stage, e.microbatch, e.phase, e.start - start, e.end - start)
                    for e in run.timeline.events]
        model = run.prediction()
        xlim = max(model.total, *(e.end for e in measured))
        plot_gantt(row[0], measured, run.timeline.labels,
                   f"{name}: measured step, {run.timeline.span():.2f} s, idle {run.idle_share():.0%}", xlim)
        plot_gantt(row[1], model.schedule, run.timeline.labels,
                   f"{name}: bubble model, {model.total:.2f} s, idle {model.bubble:.0%}", xlim)
    return fig
