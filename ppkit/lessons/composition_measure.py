"""Lesson 13, measured: one 3-D step against one process, and what each rank held and sent per dimension.

    CommLog       every collective and send seen by torch's dispatcher, credited to the mesh dimension
                  whose process group carried it, as the bytes this rank put on the wire
    compare       (on every rank) one step on the mesh == one process: the loss and every gradient;
                  plus what this rank held after Adam (its shards), what autograd kept for backward during
                  the step (activations, counted by lesson 08b's saved-tensor hooks) and what it sent, per
                  dimension
    TOLERANCE     how far float32 rounding may move the results (relative to the largest reference value)
    reference_activations  what autograd keeps in one process on the whole batch, by block (08b's counter)

Bytes on the wire per call are those of ring algorithms: an all_reduce of S bytes over n ranks sends
2(n-1)/n x S from each rank, an all_gather (n-1) x its input, a reduce_scatter (n-1)/n x its input, a send S.
"""

from __future__ import annotations

import logging
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ppkit.lessons import composition as comp
from ppkit.lessons import step_memory as sm

TOLERANCE = 1e-5


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _tensors(args) -> list[torch.Tensor]:
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out


def _group_ranks(args) -> tuple[int, ...] | None:
    """The global ranks of the process group a c10d op runs on (an object, or a functional op's name)."""
    import torch.distributed as dist
    from torch.distributed import ProcessGroup
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            a = ProcessGroup.unbox(a)
        elif isinstance(a, str):
            try:  # functional collectives name their group; other strings ("sum") name no group
                a = _resolve_process_group(a)
            except (ValueError, RuntimeError, KeyError):
                continue
        if isinstance(a, ProcessGroup):
            return tuple(dist.get_process_group_ranks(a))
    return None


def wire_bytes(op: str, tensors: list[torch.Tensor], n: int) -> float:
    """What one rank sends for one call of ``op`` (a c10d op name) over ``n`` ranks."""
    sizes = [t.nbytes for t in tensors]
    if "recv" in op or n == 1:
        return 0.0
    if "send" in op:
        return float(sum(sizes))
    if "allgather" in op or "all_gather" in op:
        return float((n - 1) * min(sizes))      # min: the input, not the output n times its size
    if "reduce_scatter" in op:
        return (n - 1) / n * max(sizes)
    if "allreduce" in op or "all_reduce" in op:
        return 2 * (n - 1) / n * sum(sizes)
    raise ValueError(f"no wire model for {op}")


class CommLog(TorchDispatchMode):
    """While active: per mesh dimension, the calls (op name -> count) and the bytes this rank sent."""

    def __init__(self, mesh3d):
        super().__init__()
        # by members, not by name: FSDP2 on a TP model slices its own 2-D mesh, with groups of its own
        import torch.distributed as dist

        self.dims = {tuple(dist.get_process_group_ranks(mesh3d[d].get_group())): (d, mesh3d[d].size())
                     for d in comp.DIMS}
        self.calls = {d: {} for d in comp.DIMS}
        self.sent = dict.fromkeys(comp.DIMS, 0.0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = str(func.overloadpacket)
        if (op.startswith("c10d.") or op.startswith("_c10d_functional.")) and "wait" not in op and \
                "wrap" not in op:
            dim, n = self.dims.get(_group_ranks(args), ("other", 0))
            if dim == "other":
                raise RuntimeError(f"{op} on a process group outside the mesh")
            name = op.rpartition(".")[2].strip("_").replace("allgather_base", "all_gather") \
                .replace("reduce_scatter_base", "reduce_scatter").replace("allreduce", "all_reduce") \
                .replace("_into_tensor", "").replace("_tensor", "")
            self.calls[dim][name] = self.calls[dim].get(name, 0) + 1
            self.sent[dim] += wire_bytes(op, _tensors(args), n)
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class RankResult:
    rank: int
    coords: tuple[int, int, int]          # this rank's (dp, pp, tp) coordinates
    loss: float | None                    # the last stage's mean loss over its micro-batches
    grad_error: float                     # largest |gradient - one process's| / largest |gradient|
    compared: int                         # parameters compared (this stage's)
    held: dict = field(default_factory=dict)   # bytes: params, grads, optimizer (this rank's shards),
                                               # activations (what autograd kept, all micro-batches)
    kept: dict = field(default_factory=dict)   # activation bytes by where autograd kept them ("layer 2", ...)
    calls: dict = field(default_factory=dict)  # dim -> {op: count}
    sent: dict = field(default_factory=dict)   # dim -> bytes this rank sent
    step_s: float = 0.0


@contextmanager
def _quiet():
    """Two notices that say nothing about this lesson: FSDP2 warns that the stage returns a view (nothing
    here writes into it), and DTensor that gathering a gradient sharded over dp and tp takes two all_gathers."""
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
            yield
    finally:
        logger.setLevel(level)


def _error(got: dict, want: dict) -> float:
    scale = max(float(w.abs().max()) for w in want.values())
    return max(float((got[k] - want[k]).abs().max()) for k in got) / scale


def compare(rank, world_size, mesh=(2, 2, 2), size: comp.Size = comp.SIZE, seed: int = 0,
            shard_dp: bool = True, ranks: int | None = None) -> RankResult | None:
    """One training step on ``mesh`` (dp, pp, tp) against ``reference_step`` (see the module docstring), on
    ranks 0 .. ``ranks`` - 1 (default: all); the ranks left out return None."""
    ranks = world_size if ranks is None else comp.check_world(ranks, world_size)
    mesh = comp.check_mesh(ranks, mesh, size)
    mesh3d = comp.device_mesh(mesh)
    if rank >= ranks:
        return None
    stage = comp.build_stage(mesh3d, size, seed, shard_dp)
    log = CommLog(mesh3d)
    start = time.perf_counter()
    # GPipe runs every micro-batch's forward before any backward: what is kept over the step is all held at once
    with log, _quiet(), sm.SavedTensors(stage) as kept:
        loss, opt = comp.train_step(mesh3d, stage, size, shard_dp)
    step_s = time.perf_counter() - start
    held = {"params": sum(_local(p).nbytes for p in stage.parameters()),
            "grads": sum(_local(p.grad).nbytes for p in stage.parameters()),
            "optimizer": sum(_local(v).nbytes for s in opt.state.values() for k, v in s.items() if k != "step"),
            "activations": kept.total()}
    with _quiet():
        grads = {n: _full(p.grad) for n, p in stage.named_parameters()}
    _, ref = comp.reference_step(size, seed)
    want = {n: p.grad for n, p in ref.named_parameters() if n in grads}
    coords = tuple(mesh3d[d].get_local_rank() for d in comp.DIMS)
    return RankResult(rank, coords, loss, _error(grads, want), len(grads), held, dict(kept.bytes), log.calls,
                      log.sent, step_s)


def reference_activations(size: comp.Size = comp.SIZE, seed: int = 0) -> dict[str, int]:
    """Bytes autograd keeps in one process's forward of the whole batch: per block ("layer 0", ...) and
    "outside the layers" (the embedding's ids, the final norm, the head and the loss)."""
    model = comp.Transformer(size, seed)
    x, y = comp.batch(size)
    with sm.SavedTensors(model) as kept:
        loss = comp.loss_fn(model(x), y)
    del loss
    return dict(kept.bytes)
