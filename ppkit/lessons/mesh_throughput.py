"""Lesson 13: which mesh is fastest, predicted from this machine's measured compute and links, then measured.

    Link, measure_links   (from mesh_links) all_reduce, all_gather, reduce_scatter and send/recv timed on this
                    cluster, every group at once, at two sizes: each kind's latency per call and bandwidth
    Compute         one rank's seconds per step: its micro-batches' forward and backward, and Adam's step apart
    measure_compute each rank's forward and backward, and Adam, of its part of the model (its stage, its tp slice
                    of each matrix, its micro-batches) in plain torch, no collectives, all ranks at once
    core_sharing    rank 0's compute alone and with all ranks at once: what sharing the cores costs
    predict         one mesh's step time: per dimension its calls x latency + bytes sent / bandwidth; the
                    micro-batches' slots (forward and backward, pp's sends, tp's all_reduces) stretched by GPipe's
                    bubble, (m + pp - 1) / m; Adam's step and dp's traffic added once (dp: an approximation, see
                    ``predict``)
    rank_meshes     the meshes whose measured memory fits a budget, fastest predicted first (tokens/s)
    measure_steps   the real step of a mesh (TP, GPipe, FSDP2), timed after a warm-up step
    plot            predicted (by part) against measured step time

Timings are taken with all ranks running at once because that is how a step runs: when the world has more ranks
than the machine has cores, the ranks share the cores, and the measured compute and latencies include that.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist
from torch import nn

from ppkit.errors import ConfigError
from ppkit.lessons import composition as comp
from ppkit.lessons.mesh_links import KINDS, SIZES, Link, link_buffers, link_call, measure_links, ring_bytes

__all__ = ["KINDS", "SIZES", "CALL_KIND", "Link", "link_buffers", "link_call", "measure_links", "ring_bytes",
           "Compute", "local_stage", "microbatches", "measure_compute", "core_sharing", "Prediction",
           "busiest_calls", "predict", "rank_meshes", "measure_steps", "plot"]

# what each dimension calls, as CommLog names them, and the link kind that carries it
CALL_KIND = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
             "send": "send_recv"}


def local_stage(mesh, stage: int, size: comp.Size = comp.SIZE) -> comp.Transformer:
    """Stage ``stage`` of the model as one tp rank computes it, in plain torch: q, k, v and fc1 with 1/tp of their
    outputs, o and fc2 with 1/tp of their inputs, the norms whole (what ``build_stage``'s plan leaves a rank)."""
    _, pp, tp = mesh
    model = comp.Transformer(size).keep_stage(stage, pp)
    d, f = size.d_model, size.ffn
    for block in model.layers.values():
        block.q, block.k, block.v = (nn.Linear(d, d // tp) for _ in range(3))
        block.o, block.fc1, block.fc2 = nn.Linear(d // tp, d), nn.Linear(d, f // tp), nn.Linear(f // tp, d)
    return model


def microbatches(mesh, size: comp.Size = comp.SIZE) -> int:
    return size.microbatches if mesh[1] > 1 else 1


@dataclass(frozen=True)
class Compute:
    """One rank's compute per step: its micro-batches' forward and backward (which the pipeline's bubble
    stretches), and Adam's step (once per step, after the pipeline has flushed)."""
    forward_backward_s: float
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return self.forward_backward_s + self.optimizer_s


def _compute_times(rank, world_size, meshes, size: comp.Size = comp.SIZE, reps: int = 5,
                   alone: bool = False) -> dict:
    """(forward and backward, Adam's step) seconds of this rank in each mesh, all ranks at once (``alone``: rank 0
    only, the others waiting)."""
    times = {}
    for mesh in meshes:
        if alone and rank > 0:
            dist.barrier()
            continue
        dp, pp, tp = mesh
        model = local_stage(mesh, rank // tp % pp, size)
        opt = torch.optim.Adam(model.parameters(), lr=comp.LR, foreach=False)
        m = microbatches(mesh, size)
        b = size.batch // (dp * m)
        x, y = (t[:b] for t in comp.batch(size))
        _forward_backward(model, x, y, m, size)
        opt.step()
        dist.barrier()
        spent = [0.0, 0.0]
        for _ in range(reps):
            start = time.perf_counter()
            _forward_backward(model, x, y, m, size)
            middle = time.perf_counter()
            opt.step()
            spent[0] += middle - start
            spent[1] += time.perf_counter() - middle
        times[mesh] = (spent[0] / reps, spent[1] / reps)
    return times


def _forward_backward(model, x, y, m: int, size: comp.Size):
    """Forward and backward of ``m`` micro-batches through one stage (a middle or last stage gets a random input,
    as from the previous stage); Adam's step comes after, timed apart."""
    for _ in range(m):
        h = model.embed(x) if model.embed is not None else torch.randn(*x.shape, size.d_model, requires_grad=True)
        for block in model.layers.values():
            h = block(h)
        (comp.loss_fn(model.head(model.norm(h)), y) if model.head is not None else h.sum()).backward()


def measure_compute(cluster, meshes, size: comp.Size = comp.SIZE, reps: int = 3, alone: bool = False) -> dict:
    """mesh -> ``Compute`` of the slowest rank for one step (without its pipeline's waits), the slowest by the
    whole step; ``alone``: rank 0's, with the other ranks idle (what a rank computes with a core of its own)."""
    per_rank = cluster.run(_compute_times, meshes=list(meshes), size=size, reps=reps, alone=alone)
    return {mesh: Compute(*max((r[mesh] for r in per_rank if mesh in r), key=sum)) for mesh in meshes}


def core_sharing(cluster, mesh, size: comp.Size = comp.SIZE, reps: int = 3) -> tuple[float, float]:
    """Rank 0's compute for one step of ``mesh``: (alone, with every rank computing at once). When the world has
    more ranks than the machine has cores, the second is longer: the ranks take turns on the cores."""
    alone = cluster.run(_compute_times, meshes=[mesh], size=size, reps=reps, alone=True)[0][mesh]
    together = cluster.run(_compute_times, meshes=[mesh], size=size, reps=reps)[0][mesh]
    return sum(alone), sum(together)


@dataclass(frozen=True)
class Prediction:
    mesh: tuple[int, int, int]
    parts: dict            # seconds: compute (forward and backward), optimizer, bubble, dp, pp, tp
    tokens: int            # tokens per step

    @property
    def step_s(self) -> float:
        return sum(self.parts.values())

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s


def busiest_calls(measurement) -> dict[str, dict[str, int]]:
    """dim -> {call: count}, the most any rank of a ``mesh_costs.Measurement`` made (as CommLog counted them)."""
    out: dict = {dim: {} for dim in comp.DIMS}
    for r in measurement.ranks:
        for dim, calls in r.calls.items():
            for name, count in calls.items():
                out[dim][name] = max(out[dim].get(name, 0), count)
    return out


def predict(mesh, compute, links: dict, calls: dict, sent: dict, size: comp.Size = comp.SIZE) -> Prediction:
    """Step time of ``mesh``: the rank's measured ``compute`` (a ``Compute``; a number is taken as forward and
    backward alone, with no optimizer) and, for each dimension, its ``calls`` ({dim: {call: count}}) times the
    latency of that call's link plus the bytes it ``sent`` ({dim: bytes}) over the slowest of its links'
    bandwidths (links looked up by (kind, degree of the dimension)).

    GPipe's bubble (pp - 1 idle slots of m + pp - 1; Narayanan et al. 2021, whose slot is a micro-batch's forward
    and backward time) stretches each micro-batch's slot. Counting tp's all_reduces and the pipeline's sends
    inside the slot, as they happen, is this lesson's extension: the bubble is (forward and backward + pp + tp) x
    (pp - 1) / m. Adam's step runs once, after the pipeline has flushed, so it is added once, not stretched. dp's
    traffic is added once too, and that is an approximation, neither an upper nor a lower bound: FSDP2's
    reduce-scatters come after the pipeline or overlap the last backward (notebook 10b), but its all-gathers run
    per micro-batch inside the slots (blocks reshard after forward), where the bubble would stretch them."""
    if not isinstance(compute, Compute):
        compute = Compute(compute, 0.0)
    m = microbatches(mesh, size)
    pp = mesh[1]
    parts = {"compute": compute.forward_backward_s, "optimizer": compute.optimizer_s, "bubble": 0.0}
    for dim, n in zip(comp.DIMS, mesh):
        dim_calls = {CALL_KIND[c]: k for c, k in calls.get(dim, {}).items() if c in CALL_KIND}
        if n == 1 or not dim_calls:
            parts[dim] = 0.0
            continue
        missing = [f"{kind} over {n} ranks" for kind in dim_calls if (kind, _n(kind, n)) not in links]
        if missing:
            raise ConfigError(f"mesh {'x'.join(map(str, mesh))}: no measured link for {', '.join(missing)} "
                              f"({dim} has degree {n}); measure it with measure_links(cluster, groups=(2, {n})).")
        used = [links[kind, _n(kind, n)] for kind in dim_calls]
        parts[dim] = sum(link.latency_s * dim_calls[link.kind] for link in used) + \
            sent.get(dim, 0.0) / min(link.bytes_per_s for link in used)
    parts["bubble"] = (compute.forward_backward_s + parts["pp"] + parts["tp"]) * (pp - 1) / m
    return Prediction(tuple(mesh), parts, size.batch * size.seq)


def _n(kind: str, degree: int) -> int:
    return 2 if kind == "send_recv" else degree  # a send is between two ranks, whatever the pipeline's depth


def rank_meshes(predictions, memory: dict, budget: float) -> list[Prediction]:
    """The predictions whose mesh's ``memory`` (bytes of the busiest rank) fits ``budget``, most tokens/s first."""
    unknown = [p.mesh for p in predictions if p.mesh not in memory]
    if unknown:
        raise ConfigError(f"no memory given for meshes {unknown}: pass memory={{mesh: bytes of its busiest rank}} "
                          "for every mesh predicted (max(mesh_costs.measure(cluster, mesh).memory())).")
    return sorted((p for p in predictions if memory[p.mesh] <= budget), key=lambda p: -p.tokens_per_s)


def _timed_steps(rank, world_size, mesh, steps: int, size: comp.Size = comp.SIZE) -> list[float]:
    from ppkit.lessons.composition_measure import _quiet

    mesh3d = comp.device_mesh(mesh)
    stage = comp.build_stage(mesh3d, size)
    times = []
    with _quiet():
        comp.train_step(mesh3d, stage, size)  # warm-up: DTensor and the pipeline work out their plans once
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            comp.train_step(mesh3d, stage, size)
            times.append(time.perf_counter() - start)
    return times


def measure_steps(cluster, mesh, steps: int = 2, size: comp.Size = comp.SIZE) -> float:
    """Median over ``steps`` of the real step's seconds (each step as long as its slowest rank's)."""
    mesh = comp.check_mesh(cluster.world_size, mesh, size)
    per_rank = cluster.run(_timed_steps, mesh=mesh, steps=steps, size=size)
    return statistics.median(max(r[i] for r in per_rank) for i in range(steps))


COLOURS = {"compute": "#4c72b0", "optimizer": "#8172b2", "bubble": "#9fb7d9", "dp": "#dd8452", "pp": "#55a868",
           "tp": "#c44e52"}


def plot(predictions, measured: dict):
    """Each prediction's parts stacked, the measured step beside it."""
    fig, ax = plt.subplots(figsize=(7, 3.2))
    xs = range(len(predictions))
    bottom = [0.0] * len(predictions)
    for part, colour in COLOURS.items():
        values = [1e3 * p.parts[part] for p in predictions]
        ax.bar([x - 0.2 for x in xs], values, width=0.4, bottom=bottom, color=colour, label=f"predicted: {part}")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.bar([x + 0.2 for x in xs], [1e3 * measured[p.mesh] for p in predictions], width=0.4, color="#444444",
           label="measured step")
    ax.set_xticks(list(xs), ["x".join(map(str, p.mesh)) for p in predictions])
    ax.set_xlabel("mesh (dp x pp x tp)")
    ax.set_ylabel("ms per step")
    ax.set_title("step time: predicted by part, and measured")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    plt.close(fig)
    return fig
