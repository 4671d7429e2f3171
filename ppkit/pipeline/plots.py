"""Plots of a sweep: time per batch over micro-batch sizes, and the Gantt timeline of one batch
beside the bubble model's ideal schedule. Each function draws on a matplotlib ``Axes``."""

from __future__ import annotations

from ppkit.pipeline.timeline import Event

FORWARD, BACKWARD = "tab:blue", "tab:orange"


def plot_gantt(ax, events: list[Event], labels: list[str], title: str, xlim: float | None = None) -> None:
    """One row per stage; forward bars blue, backward orange, micro-batch number inside."""
    for event in events:
        color = FORWARD if event.phase == "forward" else BACKWARD
        y = len(labels) - 1 - event.stage
        ax.barh(y, event.duration, left=event.start, height=0.6, color=color, alpha=0.75,
                edgecolor="black", linewidth=0.4)
        if xlim and event.duration > 0.03 * xlim:
            ax.text(event.start + event.duration / 2, y, str(event.microbatch), ha="center",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(labels)), list(reversed(labels)))
    ax.set_xlabel("seconds")
    ax.set_title(title, fontsize=10)
    if xlim:
        ax.set_xlim(0, xlim * 1.02)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=FORWARD, label="forward"), Patch(color=BACKWARD, label="backward")],
              loc="lower right", fontsize=7)


def plot_run(axes, run) -> None:
    """Measured timeline of ``run``'s last batch (left) beside the bubble model (right)."""
    timeline, prediction = run.timeline, run.prediction
    start = min((e.start for e in timeline.events), default=0.0)
    measured = [Event(e.stage, e.microbatch, e.phase, e.start - start, e.end - start)
                for e in timeline.events]
    xlim = max([e.end for e in measured] + [prediction.total if prediction else 0.0] + [1e-3])
    plot_gantt(axes[0], measured, timeline.labels,
               f"measured: {run.num_microbatches} micro-batches of {run.microbatch_size}, "
               f"{timeline.span():.2f} s", xlim)
    if prediction is not None:
        plot_gantt(axes[1], prediction.schedule, timeline.labels,
                   f"bubble model: {prediction.total:.2f} s, bubble {prediction.bubble:.0%}", xlim)


def plot_sweep(ax, runs) -> None:
    """Seconds per batch (measured) and the bubble model's fwd+bwd time, over micro-batch sizes."""
    sizes = [run.microbatch_size for run in runs]
    ax.plot(sizes, [run.seconds_per_batch for run in runs], "o-", label="measured, whole step")
    ax.plot(sizes, [run.measured_span for run in runs], "s--", label="measured, stages fwd+bwd")
    predicted = [run.prediction.total if run.prediction else float("nan") for run in runs]
    ax.plot(sizes, predicted, "^:", label="bubble model fwd+bwd")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{s}\n({run.num_microbatches})" for s, run in zip(sizes, runs)])
    ax.set_xlabel("micro-batch size (number of micro-batches)")
    ax.set_ylabel("seconds per batch")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("time per batch over micro-batch sizes", fontsize=10)


def sweep_figure(result, run_index: int | None = -1):
    """The sweep plot on top, then measured timeline | bubble model for one run (``run_index``)
    or for every run (``None``)."""
    import matplotlib.pyplot as plt

    runs = result.runs if run_index is None else [result.runs[run_index]]
    fig = plt.figure(figsize=(11, 3.2 * (1 + len(runs))), layout="constrained")
    panels = fig.subfigures(1 + len(runs), 1)
    plot_sweep(panels[0].subplots(), result.runs)
    for panel, run in zip(panels[1:], runs):
        plot_run(panel.subplots(1, 2, sharey=True), run)
    return fig


def plot_ucurve(ax, curve) -> None:
    """Step time over the number of micro-batches: measured (median, range of the rounds), the
    no-overlap reference at each count's micro-batch size (if measured), the bubble bound from the
    solo stage times, and the bound plus the fitted per-micro-batch overhead."""
    counts = curve.counts
    measured = [p.seconds for p in curve.points]
    low = [p.seconds - min(p.step_seconds) for p in curve.points]
    high = [max(p.step_seconds) - p.seconds for p in curve.points]
    ax.errorbar(counts, measured, yerr=[low, high], fmt="o-", capsize=3, label="measured step (median)")
    ax.plot(counts, [curve.reference.bound_seconds(m) for m in counts], "^:",
            label="bubble bound (solo stage times)")
    ax.plot(counts, [curve.model_seconds(m) for m in counts], "s--",
            label=f"bound + {curve.overhead_seconds * 1e3:.0f} ms per extra micro-batch")
    same = [(p.num_microbatches, p.no_overlap) for p in curve.points if p.no_overlap is not None]
    if len(same) > 1:
        ax.plot(*zip(*same), "x--", color="grey", label="no overlap, same micro-batches one at a time")
    ax.axhline(curve.reference.step_seconds, color="grey", linewidth=0.8, label="no overlap (1 micro-batch)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [f"{p.num_microbatches}\n({p.microbatch_size})" for p in curve.points])
    ax.set_xlabel("number of micro-batches (micro-batch size)")
    ax.set_ylabel("seconds per training step")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"batch {curve.config.batch_size} of {curve.config.image_size}x{curve.config.image_size}, "
                 f"cut after {curve.cut}: {curve.summary()}", fontsize=9)


def ucurve_figure(curve):
    """The U-curve on top, the measured timeline of the best count beside its bubble model below."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 6.4), layout="constrained")
    top, bottom = fig.subfigures(2, 1)
    plot_ucurve(top.subplots(), curve)
    plot_run(bottom.subplots(1, 2, sharey=True), curve.best.run)
    return fig
