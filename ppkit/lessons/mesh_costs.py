"""Lesson 13: what a mesh shape costs, measured on the cluster and by the Ultra-Scale Playbook's formulas.

    measure          one step of ``composition_measure.compare`` on every rank, gathered: equal to one
                     process?, memory per rank (model state and activations), bytes sent per step per dimension
    memory_formula   model state per rank, 16 bytes per parameter (fp32 weight and gradient, Adam's two
                     moments) over the ranks that split it: tp x pp, and dp too when FSDP shards it
    layer_activations   what autograd keeps for one block on one rank (Korthikanti et al.'s breakdown, fp32)
    activations_formula what a pipeline stage keeps over its step: its blocks, all micro-batches, and the
                     embedding's ids (first stage) or the final norm, head and loss (last stage)
    total_formula    model state + activations of the busiest stage: what the budget is held against
    comm_formula     bytes each rank sends per step, per dimension (ring algorithms)
    budget_table     every mesh of a world: the formula's memory per rank and whether it fits a budget
    plot             memory per rank and traffic per dimension, measured beside the formulas
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt

from ppkit.lessons import composition as comp
from ppkit.lessons import composition_measure as cm

BYTES_PER_PARAM = 16  # fp32 weight 4 + gradient 4 + Adam's exp_avg 4 + exp_avg_sq 4


@dataclass(frozen=True)
class Measurement:
    mesh: tuple[int, int, int]
    shard_dp: bool
    size: comp.Size
    ranks: tuple[cm.RankResult, ...]
    reference_loss: float

    def title(self) -> str:
        return "x".join(map(str, self.mesh)) + (" (dp shards: FSDP2)" if self.shard_dp else " (dp replicas)")

    @property
    def loss(self) -> float:
        """The step's loss: the last stages' losses averaged over the dp ranks."""
        last = [r.loss for r in self.ranks if r.loss is not None and r.coords[2] == 0]
        return sum(last) / len(last)

    @property
    def grad_error(self) -> float:
        return max(r.grad_error for r in self.ranks)

    @property
    def equal(self) -> bool:
        return abs(self.loss - self.reference_loss) <= cm.TOLERANCE * abs(self.reference_loss) and \
            self.grad_error <= cm.TOLERANCE

    def memory(self) -> list[int]:
        """Bytes each rank needs: its model state after the step plus the activations autograd kept in it
        (the Playbook's sum; a bound, since backward frees activations as the gradients fill in)."""
        return [sum(r.held.values()) for r in self.ranks]

    def model_state(self) -> list[int]:
        """Bytes of parameters, gradients and Adam's moments each rank held after the step."""
        return [r.held["params"] + r.held["grads"] + r.held["optimizer"] for r in self.ranks]

    def activations(self) -> list[int]:
        """Bytes autograd kept for backward on each rank over the step (every micro-batch's)."""
        return [r.held["activations"] for r in self.ranks]

    def sent(self, dim: str) -> float:
        """The most bytes any rank sent over ``dim`` in the step."""
        return max(r.sent[dim] for r in self.ranks)

    def fits(self, budget: float) -> bool:
        return max(self.memory()) <= budget


def measure(cluster, mesh, shard_dp: bool = True, size: comp.Size = comp.SIZE, world_size: int | None = None,
            timeout: float = 300) -> Measurement:
    """One step of ``mesh`` on ranks 0 .. ``world_size`` - 1 of ``cluster`` (default: all of them); refused
    here, before anything runs, if it cannot be."""
    world_size = comp.check_world(cluster.world_size if world_size is None else world_size, cluster.world_size)
    mesh = comp.check_mesh(world_size, mesh, size)
    ranks = cluster.run(cm.compare, mesh=mesh, size=size, shard_dp=shard_dp, ranks=world_size, timeout=timeout)
    return Measurement(mesh, shard_dp, size, tuple(r for r in ranks if r is not None), comp.reference_step(size)[0])


def memory_formula(mesh, size: comp.Size = comp.SIZE, shard_dp: bool = True) -> float:
    dp, pp, tp = mesh
    return BYTES_PER_PARAM * size.params() / (pp * tp * (dp if shard_dp else 1))


def layer_activations(size: comp.Size, b: int, tp: int) -> float:
    """Bytes one block keeps for backward on one rank, fp32, for ``b`` sequences (lesson 10's ``kept_tp``):
    whole on every tp rank, the two norms' inputs and outputs (4 sbh) and each norm's mean and 1/std (2 sb);
    split over tp, q, k, v and the attention output (4 sbh), fc1's output and GELU's (2 sbf), and SDPA's
    log-sum-exp per head and row (a sb)."""
    s, h, f, a = size.seq, size.d_model, size.ffn, size.heads
    return 4 * (4 * s * b * h + 2 * 2 * s * b) + 4 * (4 * s * b * h + 2 * s * b * f + a * s * b) / tp


def activations_formula(mesh, size: comp.Size = comp.SIZE, stage: int | None = None) -> float:
    """What pipeline stage ``stage`` (default: the one that keeps most) keeps over one step on ``mesh``.

    dp: each rank runs batch / dp sequences (sharding the model over dp with FSDP changes nothing here).
    pp: a stage runs layers / pp blocks, and GPipe runs every micro-batch's forward before any backward, so all
    of them are kept at once: m micro-batches of b / m sequences keep what b sequences do. tp: divides what
    ``layer_activations`` says it splits. Outside the blocks: the token ids (int64) on the first stage; the
    final norm's input, output and statistics, the head's output as log-probabilities over the vocabulary, the
    targets (int64) and one 4-byte total weight per micro-batch (cross-entropy) on the last."""
    dp, pp, tp = mesh
    s, h, b = size.seq, size.d_model, size.batch // dp
    if stage is None:
        return max(activations_formula(mesh, size, st) for st in range(pp))
    kept = size.layers // pp * layer_activations(size, b, tp)
    if stage == 0:
        kept += 8 * s * b
    if stage == pp - 1:
        kept += 4 * (2 * s * b * h + 2 * s * b) + 4 * s * b * size.vocab + 8 * s * b + \
            4 * (size.microbatches if pp > 1 else 1)
    return kept


def total_formula(mesh, size: comp.Size = comp.SIZE, shard_dp: bool = True) -> float:
    """Model state (``memory_formula``) plus the activations of the stage that keeps most."""
    return memory_formula(mesh, size, shard_dp) + activations_formula(mesh, size)


def _ring(n: int) -> float:
    return (n - 1) / n


def comm_formula(mesh, size: comp.Size = comp.SIZE, shard_dp: bool = True) -> dict[str, float]:
    """Bytes each rank sends per step over each dimension, the most any rank sends.

    dp: a rank's replica slice holds P = params / (tp x pp); ZeRO-3 gathers it in forward and again in
    backward and reduce-scatters its gradient: 3 (dp-1)/dp x 4P bytes; replicas all_reduce it: 2 (dp-1)/dp x 4P.
    tp: per block and micro-batch, two all_reduces of the activation in forward and two in backward, each
    2 (tp-1)/tp x the activation. pp: per micro-batch one activation forward and its gradient backward;
    a middle stage sends both."""
    dp, pp, tp = mesh
    m = size.microbatches if pp > 1 else 1
    activation = 4 * size.batch // (dp * m) * size.seq * size.d_model
    slice_bytes = 4 * size.params() / (tp * pp)
    return {"dp": (3 if shard_dp else 2) * _ring(dp) * slice_bytes,
            "pp": 0.0 if pp == 1 else m * activation * (1 if pp == 2 else 2),
            "tp": 4 * m * size.layers // pp * 2 * _ring(tp) * activation}


def budget_table(world_size: int, budget: float, size: comp.Size = comp.SIZE, shard_dp: bool = True):
    """(mesh, bytes per rank by the formula: model state + activations, fits) for every mesh the world and the
    model can take."""
    return [(mesh, total_formula(mesh, size, shard_dp), total_formula(mesh, size, shard_dp) <= budget)
            for mesh in comp.shapes(world_size, size)]


COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#8172b3"}


def plot(m: Measurement, budget: float | None = None):
    """Left: each rank's model state and activations, measured (stacked), against the formula (model state,
    and each stage's total) and the budget. Right: bytes sent per step over each dimension, the busiest rank
    measured beside the formula."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    bottom = [0] * len(m.ranks)
    for kind, colour in COLOURS.items():
        values = [r.held[kind] for r in m.ranks]
        left.bar(range(len(m.ranks)), values, bottom=bottom, color=colour, label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    state = memory_formula(m.mesh, m.size, m.shard_dp)
    left.axhline(state, color="black", ls="--", label="formula: state 16 P / N")
    totals = [state + activations_formula(m.mesh, m.size, r.coords[1]) for r in m.ranks]
    left.scatter(range(len(m.ranks)), totals, marker="_", s=400, color="black", zorder=3,
                 label="formula: state + activations")
    if budget is not None:
        left.axhline(budget, color="#c44e52", ls=":", lw=2, label="budget")
    left.set_xticks(range(len(m.ranks)), [f"{r.rank}\n{'.'.join(map(str, r.coords))}" for r in m.ranks])
    left.set_xlabel("rank, and its (dp.pp.tp) coordinates")
    left.set_ylabel("bytes")
    left.set_title(f"model state and activations per rank, mesh {m.title()}")
    top = max([*bottom, *totals] + ([budget] if budget is not None else []))
    left.set_ylim(0, top * 1.4)  # room for the legend above the bars
    left.legend(fontsize=8, loc="upper left", ncol=3)
    formula = comm_formula(m.mesh, m.size, m.shard_dp)
    xs = range(len(comp.DIMS))
    right.bar([x - 0.2 for x in xs], [m.sent(d) for d in comp.DIMS], width=0.4, label="measured (busiest rank)")
    right.bar([x + 0.2 for x in xs], [formula[d] for d in comp.DIMS], width=0.4, color="#bbbbbb",
              label="Playbook formula")
    right.set_xticks(list(xs), [f"{d} ({n})" for d, n in zip(comp.DIMS, m.mesh)])
    right.set_ylabel("bytes sent per rank per step")
    right.set_title("communication per dimension")
    right.legend(fontsize=8)
    fig.tight_layout()
    plt.close(fig)
    return fig
