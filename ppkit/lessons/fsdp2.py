"""Lesson 9, part 2: torch's own ZeRO-3, FSDP2 (``fully_shard``), on a CPU device mesh with gloo.

``train`` runs the same model, batch shards and Adam steps as ``zero.train`` and ``zero.ddp_train``,
with every Linear and then the whole model wrapped by ``fully_shard``. Parameters become DTensors
sharded on dim 0 (``Shard(0)``); ``CommDebugMode`` counts the collectives FSDP2 calls.

``cpu_offload_default`` is what does not run on a machine without CUDA: ``CPUOffloadPolicy()``
pins host memory by default, and pinning needs the CUDA driver.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ppkit.lessons import data_parallel as dp
from ppkit.lessons.zero import LR


def _local(t) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _counts(mode) -> dict[str, int]:
    # "c10d._allgather_base_" -> "all_gather"; the op names differ between torch versions
    out: dict[str, int] = {}
    for op, count in mode.get_comm_counts().items():
        name = str(op).lower()
        key = ("all_gather" if "allgather" in name or "all_gather" in name
               else "reduce_scatter" if "reduce_scatter" in name else "all_reduce" if "allreduce" in name
               or "all_reduce" in name else name)
        out[key] = out.get(key, 0) + count
    return out


def shard_model(world_size: int, seed: int = 0):
    """Notebook 03's classifier with each Linear and then the whole model wrapped by ``fully_shard``.

    The outer wrap matters even though the Sequential has no parameters of its own: FSDP2 keeps the
    *root* module's weights gathered from forward to backward, so without it each Linear would be a
    root and none would be resharded after forward (that is ZeRO-2's memory, not ZeRO-3's)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = dp.make_model(seed)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)  # one all_gather / reduce_scatter per layer
    fully_shard(model, mesh=mesh)
    return model


def train(rank, world_size, steps: int = 3, lr: float = LR, batch_size: int = 24, seed: int = 0) -> dict:
    """FSDP2 training: the final full parameters, the bytes this rank held (its shards of parameters
    and gradients after backward, optimizer state after the step), the local shard shapes and the
    collectives of one step, as counted by ``CommDebugMode``."""
    from torch.distributed.tensor.debug import CommDebugMode

    dp.check_even(batch_size, world_size)
    model = shard_model(world_size, seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = dp.make_batch(batch_size)
    mine = dp.shard_indices(batch_size, rank, world_size)
    held, counts = {}, {}
    for _ in range(steps):
        opt.zero_grad()
        mode = CommDebugMode()
        with mode, warnings.catch_warnings():
            # the root's output is a view made by the last layer's backward hook; FSDP2 warns about
            # in-place ops on it, and there are none here
            warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
            F.cross_entropy(model(x[mine]), y[mine]).backward()
        counts = _counts(mode)
        grads = sum(_local(p.grad).nbytes for p in model.parameters())
        params = sum(_local(p).nbytes for p in model.parameters())
        opt.step()
        optimizer = sum(_local(v).nbytes for s in opt.state.values() for k, v in s.items() if k != "step")
        held = {"params": params, "grads": grads, "optimizer": optimizer}
    return {"params": {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()},
            "held": held, "counts": counts,
            "shapes": {name: tuple(_local(p).shape) for name, p in model.named_parameters()}}


def cpu_offload_default(rank, world_size) -> None:
    """``fully_shard`` with ``CPUOffloadPolicy()`` as documented: on a machine without CUDA this
    raises, because the default ``pin_memory=True`` asks the CUDA driver for page-locked memory."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    fully_shard(dp.make_model(), mesh=init_device_mesh("cpu", (world_size,)),
                offload_policy=CPUOffloadPolicy())


def cpu_offload_unpinned(rank, world_size) -> float:
    """The same with ``CPUOffloadPolicy(pin_memory=False)``: it runs; one forward and backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    model = dp.make_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)),
                offload_policy=CPUOffloadPolicy(pin_memory=False))
    x, y = dp.make_batch(8)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.item()
