"""Every schedule side by side, per rank: a table (time per step, the bubble measured, in the bubble
model, in torch's plan with equal stages and in the paper's formula; activations) and each
measured step drawn beside its bubble model.

    runs = compare.compare_looped(cluster, x, y, 4)
    print(format_looped_table(runs)); plot_looped(runs)
"""

from __future__ import annotations

from ppkit.pipeline.schedules.bubble_formulas import FORMULAS, formula_idle_share, plan_idle_share
from ppkit.pipeline.schedules.looped_run import LoopedRun
from ppkit.pipeline.schedules.plan import KIND_NAMES, Work, busy, span

COLUMNS = ("schedule", "stages/rank", "s / step", "computing s per rank", "idle: measured", "bubble model",
           "torch plan, equal stages", "formula, equal stages", "activations per rank")
COLORS = {"F": "tab:blue", "B": "tab:orange", "I": "tab:red", "W": "tab:green"}


def table_rows(runs: dict[str, LoopedRun]) -> list[list[str]]:
    """One row per run. *computing*: the seconds each rank computed in the last step; *bubble
    model*: the plan replayed with the measured op times; *equal stages*: every rank's work per
    micro-batch F = I = W (B = 2F), in torch's plan and in the schedule's formula."""
    rows = []
    for name, run in runs.items():
        computing = ", ".join(f"{busy(run.works, r):.2f}" for r in range(run.num_ranks))
        rows.append([
            name, str(run.stages_per_rank), f"{run.step_time:.3f}", computing,
            f"{run.idle_share():.0%}", f"{run.predicted_idle_share():.0%}",
            f"{plan_idle_share(name, run.plan):.0%}",
            f"{formula_idle_share(name, run.num_ranks, run.num_microbatches):.0%} = {FORMULAS[name].text}",
            ", ".join(f"{b / 2**20:.1f}" for b in run.peak_activation_bytes) + " MiB"])
    return rows


def format_looped_table(runs: dict[str, LoopedRun]) -> str:
    rows = [list(COLUMNS), *table_rows(runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows)


def format_formulas(schedules=tuple(FORMULAS)) -> str:
    """Each schedule's bubble formula, what it assumes and where it comes from."""
    return "\n".join(f"{name:>22}: bubble = {FORMULAS[name].text}  ({FORMULAS[name].assumes})\n"
                     f"{'':>24}{FORMULAS[name].source}" for name in schedules)


def draw_ranks(ax, works: list[Work], num_ranks: int, stage_ranks: list[int], title: str, xlim: float) -> None:
    """One row per rank; colour = kind of work (F, B, I, W), hatched = the rank's second stage,
    the micro-batch number inside the bar where it fits."""
    first_stage = {rank: min(s for s, r in enumerate(stage_ranks) if r == rank) for rank in range(num_ranks)}
    for w in works:
        y = num_ranks - 1 - w.rank
        ax.barh(y, w.duration, left=w.start, height=0.6, color=COLORS[w.kind], alpha=0.75, edgecolor="black",
                linewidth=0.4, hatch="//" if w.stage != first_stage[w.rank] else None)
        if w.duration > 0.025 * xlim:
            ax.text(w.start + w.duration / 2, y, str(w.microbatch), ha="center", va="center", fontsize=6)
    labels = [f"rank {r}: stage{'s' if stage_ranks.count(r) > 1 else ''} "
              + "+".join(str(s) for s, sr in enumerate(stage_ranks) if sr == r) for r in range(num_ranks)]
    ax.set_yticks(range(num_ranks), list(reversed(labels)), fontsize=8)
    ax.set_xlim(0, xlim * 1.02)
    ax.set_title(title, fontsize=9)


def _legend(fig) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=COLORS[k], alpha=0.75, label=KIND_NAMES[k]) for k in COLORS]
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="a rank's second stage"))
    fig.legend(handles=handles, loc="outside upper center", ncols=len(handles), fontsize=8)


def plot_looped(runs: dict[str, LoopedRun]):
    """For every run: the measured last step (left) beside its bubble model (right), same scale,
    in seconds; the number in a bar is its micro-batch."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(12, 0.4 + 1.7 * len(runs)), squeeze=False,
                             layout="constrained")
    for row, (name, run) in zip(axes, runs.items()):
        start = min(w.start for w in run.works)
        measured = [Work(w.rank, w.stage, w.kind, w.microbatch, w.start - start, w.end - start) for w in run.works]
        model = run.prediction()
        xlim = max(span(model), span(measured))
        draw_ranks(row[0], measured, run.num_ranks, run.stage_ranks,
                   f"{name}: measured, {span(measured):.2f} s, idle {run.idle_share():.0%}", xlim)
        draw_ranks(row[1], model, run.num_ranks, run.stage_ranks,
                   f"{name}: bubble model, {span(model):.2f} s, idle {run.predicted_idle_share():.0%}", xlim)
    _legend(fig)
    return fig
