"""Pictures for notebooks 09 and 10: memory and communication per rank, formula and measured.

Formulas are bars; measured values, where given, are black dots on them, so a learner sees at a
glance whether the code does what the formula says.
"""

from __future__ import annotations

from ppkit.lessons import tensor_parallel as tp
from ppkit.lessons import zero

PARTS = ("params", "grads", "optimizer")
COLOURS = {"params": "#4c78a8", "grads": "#f58518", "optimizer": "#54a24b", "weights": "#4c78a8",
           "activation": "#b279a2", "comm": "#e45756"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def _unit(largest: float) -> tuple[float, str]:
    for scale, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if largest >= scale:
            return scale, name
    return 1.0, "bytes"


def plot_zero(psi: int, world_size: int, measured: dict | None = None, highlight: int | None = None):
    """Per rank, for stages 0-3: bytes held (stacked) and bytes sent per step. ``measured`` maps
    stage -> ``zero.train``'s result for one rank. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    memory = {s: zero.memory_formula(psi, world_size, s) for s in zero.STAGES}
    comm = {s: zero.comm_formula(psi, world_size, s) for s in zero.STAGES}
    fig = Figure(figsize=(9, 3.2), layout="constrained")
    ax_mem, ax_comm = fig.subplots(1, 2)
    scale, unit = _unit(max(sum(m.values()) for m in memory.values()))
    cscale, cunit = _unit(max(comm.values()))
    for s in zero.STAGES:
        bottom, alpha = 0.0, 1.0 if highlight in (None, s) else 0.35
        for part in PARTS:
            ax_mem.bar(s, memory[s][part] / scale, bottom=bottom / scale, color=COLOURS[part], alpha=alpha,
                       label=part if s == 0 else None, edgecolor="black" if highlight == s else None)
            bottom += memory[s][part]
        if measured:
            ax_mem.plot(s, sum(measured[s]["held"].values()) / scale, "k.",
                        label="measured" if s == 0 else None)
        ax_comm.bar(s, comm[s] / cscale, color=COLOURS["comm"], alpha=alpha,
                    edgecolor="black" if highlight == s else None)
        if measured:
            ax_comm.plot(s, measured[s]["sent_bytes"] / cscale, "k.")
    for ax, title, u in ((ax_mem, "held per rank", unit), (ax_comm, "sent per rank per step", cunit)):
        ax.set_xticks(list(zero.STAGES), ["DDP"] + [f"ZeRO-{s}" for s in zero.STAGES[1:]])
        ax.set_ylabel(u)
        ax.set_title(f"{title} ({world_size} ranks, {psi:,} params)", fontsize=10)
    ax_mem.legend(fontsize=8)
    return fig


def plot_tensor_parallel(degree: int, d_model: int, hidden: int, tokens: int, degrees=(1, 2, 4, 8),
                         measured: dict | None = None):
    """The MLP block per rank against the tensor-parallel degree: weights and hidden activation held,
    bytes sent per forward+backward. ``measured`` maps degree -> {"weights": .., "sent": ..}."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.2), layout="constrained")
    ax_mem, ax_comm = fig.subplots(1, 2)
    memory = {t: tp.mlp_memory_formula(t, d_model, hidden, tokens) for t in degrees}
    comm = {t: tp.comm_formula("mlp", t, tokens, d_model)["sent_bytes"] for t in degrees}
    scale, unit = _unit(max(sum(m.values()) for m in memory.values()))
    cscale, cunit = _unit(max(comm.values()) or 1.0)
    xs = range(len(degrees))
    for x, t in zip(xs, degrees):
        alpha = 1.0 if t == degree else 0.35
        edge = "black" if t == degree else None
        ax_mem.bar(x, memory[t]["weights"] / scale, color=COLOURS["weights"], alpha=alpha, edgecolor=edge,
                   label="weights" if x == 0 else None)
        ax_mem.bar(x, memory[t]["activation"] / scale, bottom=memory[t]["weights"] / scale, alpha=alpha,
                   color=COLOURS["activation"], edgecolor=edge, label="hidden activation" if x == 0 else None)
        ax_comm.bar(x, comm[t] / cscale, color=COLOURS["comm"], alpha=alpha, edgecolor=edge)
        if measured and t in measured:
            ax_mem.plot(x, measured[t]["weights"] / scale, "k.", label="measured" if x == 0 else None)
            ax_comm.plot(x, measured[t]["sent"] / cscale, "k.")
    for ax, title, u in ((ax_mem, "held per rank", unit), (ax_comm, "sent per rank, fwd + bwd", cunit)):
        ax.set_xticks(list(xs), [f"TP={t}" for t in degrees])
        ax.set_ylabel(u)
        ax.set_title(f"MLP {d_model}-{hidden}-{d_model}, {tokens:,} tokens: {title}", fontsize=9)
    ax_mem.legend(fontsize=8)
    return fig
