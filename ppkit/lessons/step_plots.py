"""Lesson 08b's pictures: activations per layer as the sequence and the batch grow (measured beside the
formulas), and a step's peak memory by part, predicted beside measured."""

from __future__ import annotations

from matplotlib.figure import Figure

from ppkit.lessons import step_memory as sm

MIB = 2 ** 20


def sweep(size: sm.Size, seq_lens=(32, 64, 128, 256), batches=(1, 2, 4, 8), fixed_b: int = 2,
          fixed_s: int = 128) -> dict[str, list[tuple[int, int, int]]]:
    """Measured bytes kept per layer (layer 0), as (s, b, bytes): over ``seq_lens`` at batch ``fixed_b``, and
    over ``batches`` at sequence length ``fixed_s``."""
    model = sm.GPT(size)

    def kept(s, b):
        return s, b, sm.saved_by_layer(model, sm.batch(size, b, s)).bytes["layer 0"]

    return {"seq": [kept(s, fixed_b) for s in seq_lens], "batch": [kept(fixed_s, b) for b in batches]}


def plot_activations(size: sm.Size, rows: dict[str, list[tuple[int, int, int]]]):
    """Two panels: bytes per layer over the sequence length and over the micro-batch size; measured (fp32, no
    dropout), the breakdown for this run, and the Playbook's 16-bit formula with dropout."""
    h, a = size.d_model, size.heads
    fig = Figure(figsize=(10, 3.6))
    axes = fig.subplots(1, 2)
    for ax, key, label in ((axes[0], "seq", "sequence length s"), (axes[1], "batch", "micro-batch size b")):
        data = rows[key]
        xs = [s if key == "seq" else b for s, b, _ in data]
        ax.plot(xs, [kept / MIB for _, _, kept in data], "o-", label="measured (saved-tensor hooks)")
        ax.plot(xs, [sm.formula_for(size, s, b) / MIB for s, b, _ in data], "k--",
                label="breakdown for this run (fp32, no dropout)")
        ax.plot(xs, [sm.playbook_activations(s, b, h, a) / MIB for s, b, _ in data], ":", color="tab:red",
                label="Playbook: sbh(34 + 5as/h), 16-bit")
        fixed = f"b = {data[0][1]}" if key == "seq" else f"s = {data[0][0]}"
        ax.set(xlabel=label, ylabel="MiB kept per layer", title=f"one layer, {fixed}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


MEASURED_PARTS = ("params", "grads", "optimizer", "activations", "temporaries")


def plot_peak(measured, predicted: dict):
    """Stacked bars: the step's predicted peak by part (the parts of whichever moment holds it, as
    ``step_peak.predicted_peak`` gives them), and the measured one by MemTracker's categories."""
    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    predicted_parts = tuple(part for part in predicted if part != "total")
    for x, (name, values, parts) in enumerate((("predicted", predicted, predicted_parts),
                                               ("measured", measured.peak, MEASURED_PARTS))):
        bottom = 0.0
        for part in parts:
            value = values.get(part, 0) / MIB
            ax.bar(x, value, bottom=bottom, label=f"{name}: {part}", width=0.6)
            bottom += value
    ax.set_xticks([0, 1], ["predicted", "measured"])
    ax.set(ylabel="MiB at the step's peak", title=f"s = {measured.seq_len}, b = {measured.microbatch_size}, "
           f"k = {measured.accumulation_steps}, recompute {measured.policy}")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    fig.tight_layout()
    return fig
