"""Lesson 13: what a mesh shape costs, measured on the cluster and by the Ultra-Scale Playbook's formulas.

    measure          one step of ``composition_measure.compare`` on every rank, gathered: equal to one
                     process?, memory per rank, bytes sent per step per dimension
    memory_formula   model state per rank, 16 bytes per parameter (fp32 weight and gradient, Adam's two
                     moments) over the ranks that split it: tp x pp, and dp too when FSDP shards it
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
        """Bytes of model state each rank held after the step."""
        return [sum(r.held.values()) for r in self.ranks]

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
    """(mesh, memory per rank by the formula, fits) for every mesh the world and model can take."""
    return [(mesh, memory_formula(mesh, size, shard_dp), memory_formula(mesh, size, shard_dp) <= budget)
            for mesh in comp.shapes(world_size, size)]


COLOURS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868"}


def plot(m: Measurement, budget: float | None = None):
    """Left: each rank's model state, measured (stacked) against the formula and the budget. Right: bytes
    sent per step over each dimension, the busiest rank measured beside the formula."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    bottom = [0] * len(m.ranks)
    for kind, colour in COLOURS.items():
        values = [r.held[kind] for r in m.ranks]
        left.bar(range(len(m.ranks)), values, bottom=bottom, color=colour, label=kind)
        bottom = [b + v for b, v in zip(bottom, values)]
    left.axhline(memory_formula(m.mesh, m.size, m.shard_dp), color="black", ls="--", label="formula 16 P / N")
    if budget is not None:
        left.axhline(budget, color="#c44e52", ls=":", lw=2, label="budget")
    left.set_xticks(range(len(m.ranks)), [f"{r.rank}\n{'.'.join(map(str, r.coords))}" for r in m.ranks])
    left.set_xlabel("rank, and its (dp.pp.tp) coordinates")
    left.set_ylabel("bytes after the step")
    left.set_title(f"model state per rank, mesh {m.title()}")
    top = max([*bottom, memory_formula(m.mesh, m.size, m.shard_dp)] + ([budget] if budget is not None else []))
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
