"""Lesson 08b at real size: the Playbook's memory formulas for Llama-3-like 8B and 70B models, as the sequence grows.

    REAL_SIZES        layers, width h, heads a, parameters of each (Llama 3 8B and 70B shapes)
    memory_gib        GiB per part (parameters, gradients, optimizer, activations) for one sequence of length s
    plot_memory       the Playbook's figure shape: stacked parts over the sequence length, per recompute policy

Mixed precision as the Playbook counts it: bf16 parameters and gradients (2 + 2 bytes per parameter), fp32 master
weights and Adam's two moments (4 + 4 + 4). Activations are the Playbook's s b h (34 + 5 a s / h) bytes per layer
(16-bit, dropout on): its GPT formula, which Llama's grouped-query attention and SwiGLU MLP change by some tens of
percent, not in shape. Selective recomputation drops the 5 a s / h term; full keeps each layer's input, 2 s b h.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ppkit.lessons import step_memory as sm

GIB = 2 ** 30
REAL_SIZES = {"8B": {"layers": 32, "h": 4096, "a": 32, "params": 8.03e9},
              "70B": {"layers": 80, "h": 8192, "a": 64, "params": 70.6e9}}
PER_LAYER = {"none": lambda s, b, h, a: sm.playbook_activations(s, b, h, a),
             "selective": lambda s, b, h, a: 34 * s * b * h,
             "full": lambda s, b, h, a: 2 * s * b * h}


def memory_gib(model: str, s: int, b: int = 1, policy: str = "none") -> dict[str, float]:
    """GiB of each part of one training step of ``model`` ("8B" or "70B") on one device, nothing sharded."""
    m = REAL_SIZES[model]
    per_layer = PER_LAYER[sm.check_policy(policy)](s, b, m["h"], m["a"])
    return {"parameters (bf16)": 2 * m["params"] / GIB, "gradients (bf16)": 2 * m["params"] / GIB,
            "optimizer (fp32 master + Adam)": 12 * m["params"] / GIB,
            "activations": m["layers"] * per_layer / GIB}


def plot_memory(seq_lens=(1024, 2048, 4096, 8192, 16384), policies=("none", "full")):
    """One panel per model and policy: the parts stacked as bars over the sequence length (b = 1)."""
    fig = Figure(figsize=(11, 3.4 * len(policies)))
    axes = fig.subplots(len(policies), len(REAL_SIZES), squeeze=False)
    for row, policy in enumerate(policies):
        for col, model in enumerate(REAL_SIZES):
            ax, bottom = axes[row][col], [0.0] * len(seq_lens)
            table = [memory_gib(model, s, 1, policy) for s in seq_lens]
            for part in table[0]:
                values = [t[part] for t in table]
                ax.bar([str(s) for s in seq_lens], values, bottom=bottom, label=part)
                bottom = [a + v for a, v in zip(bottom, values)]
            ax.set(title=f"Llama-3-like {model}, recompute {policy}", xlabel="sequence length (b = 1)", ylabel="GiB")
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig
