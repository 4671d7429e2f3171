"""Lesson 3, data parallelism: the same gradients three ways, init methods, samplers, launchers.

1. one process, the whole batch              -> ``whole_batch_gradients``
2. every rank a shard, then all_reduce / n   -> ``manual_gradients`` (seed 001's closing idea)
3. every rank a shard, DistributedDataParallel -> ``ddp_gradients``

They agree when the loss is a mean and the shards are the same size: the mean of the shards'
mean gradients is then the whole batch's mean gradient.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DistributedSampler

from ppkit.cluster import worker_setup
from ppkit.cluster.worker_setup import free_port  # noqa: F401 (the lessons' and notebooks' name)
from ppkit.errors import ConfigError
from ppkit.lessons import gpus
from ppkit.transport import ifaces

IN_FEATURES, HIDDEN, CLASSES = 4, 16, 3


def make_model(seed: int = 0) -> nn.Module:
    """A small classifier; the same ``seed`` gives the same weights in every process."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES))


def make_batch(batch_size: int = 24, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and class labels; the same ``seed`` gives the same batch everywhere."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, IN_FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (batch_size,), generator=g)
    return x, y


def shard_indices(batch_size: int, rank: int, world_size: int) -> list[int]:
    """The samples rank ``rank`` trains on: what ``DistributedSampler`` (no shuffling) gives it."""
    return list(DistributedSampler(range(batch_size), num_replicas=world_size, rank=rank, shuffle=False))


def check_even(batch_size: int, world_size: int) -> None:
    if batch_size % world_size:
        raise ConfigError(
            f"batch_size {batch_size} does not split evenly over {world_size} ranks: DistributedSampler "
            f"would repeat {world_size - batch_size % world_size} sample(s) to even it out, and the "
            "averaged gradient would no longer equal the whole batch's. Pick a batch size that "
            f"{world_size} divides.")


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def whole_batch_gradients(batch_size: int = 24, seed: int = 0) -> dict[str, torch.Tensor]:
    """One process, the whole batch, mean loss: the gradients the others must reproduce."""
    model = make_model(seed)
    x, y = make_batch(batch_size)
    F.cross_entropy(model(x), y).backward()
    return _grads(model)


def local_backward(rank: int, world_size: int, batch_size: int = 24, seed: int = 0) -> nn.Module:
    """Build the model and run forward/backward on this rank's shard only (no communication)."""
    check_even(batch_size, world_size)
    model = make_model(seed)
    x, y = make_batch(batch_size)
    mine = shard_indices(batch_size, rank, world_size)
    F.cross_entropy(model(x[mine]), y[mine]).backward()
    return model


def average_gradients(model: nn.Module) -> None:
    """Seed 001's closing idea: sum every gradient over the ranks, then divide by their number."""
    world_size = dist.get_world_size()
    for param in model.parameters():
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad /= world_size


def manual_gradients(rank, world_size, batch_size: int = 24, seed: int = 0) -> dict[str, torch.Tensor]:
    """Each rank: backward on its shard, then ``average_gradients``. Returns the gradients."""
    model = local_backward(rank, world_size, batch_size, seed)
    average_gradients(model)
    return _grads(model)


def ddp_gradients(rank, world_size, batch_size: int = 24, seed: int = 0) -> dict[str, torch.Tensor]:
    """Each rank: DistributedDataParallel on its shard. DDP averages during backward."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    check_even(batch_size, world_size)
    model = DDP(make_model(seed))  # CPU + gloo: no device_ids
    x, y = make_batch(batch_size)
    mine = shard_indices(batch_size, rank, world_size)
    F.cross_entropy(model(x[mine]), y[mine]).backward()
    return _grads(model.module)


def max_difference(a: dict, b: dict) -> float:
    """The largest absolute difference between two gradient dicts with the same keys."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def train(rank, world_size, steps: int = 5, lr: float = 0.5, batch_size: int = 24, seed: int = 0):
    """A few steps of plain SGD with DDP on shards (or, with ``world_size == 1`` outside a process
    group, one process on the whole batch). Returns the final parameters and the loss per step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    check_even(batch_size, world_size)
    model = make_model(seed)
    net = DDP(model) if dist.is_initialized() else model
    x, y = make_batch(batch_size)
    mine = shard_indices(batch_size, rank, world_size)
    losses = []
    for _ in range(steps):
        model.zero_grad()
        loss = F.cross_entropy(net(x[mine]), y[mine])
        loss.backward()
        with torch.no_grad():  # SGD by hand: w <- w - lr * grad (torch.optim.SGD does the same)
            for p in model.parameters():
                p -= lr * p.grad
        losses.append(loss.item())
    return {"params": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses}


# -- init methods -------------------------------------------------------------------------------

def port_is_open(port: int, host: str = "127.0.0.1", cluster=None) -> bool:
    """Whether something still listens on ``port`` (a store left behind, say): on this machine's
    loopback, or with ``cluster`` on the one its workers see, asked by its rank 0 (a loopback of
    their own where ppkit isolates them from other users: docs/isolation.md)."""
    if cluster is not None:
        return cluster.run(_port_is_open_here, port, host)[0]
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _port_is_open_here(rank: int, world_size: int, port: int, host: str) -> bool:
    return port_is_open(port, host)


def init_demo(rank, world_size, init_method: str, env: dict | None = None, timeout_s: float = 60):
    """Join a fresh process group with ``init_method``, all_reduce ``rank + 1``, leave again.

    Run it on a cluster made with ``process_group=False`` (the ranks have no group yet). For
    ``env://`` pass ``env`` with MASTER_ADDR/MASTER_PORT; RANK and WORLD_SIZE are set here.
    """
    if dist.is_initialized():
        raise ConfigError("this rank is already in a process group; run init_demo on a cluster "
                          "started with ppkit.Cluster(n, process_group=False).")
    start = time.perf_counter()
    if init_method == "env://":
        os.environ.update({**(env or {}), "RANK": str(rank), "WORLD_SIZE": str(world_size)})
    store = loopback_store(init_method, world_size, timeout_s) if rank == 0 else None
    if init_method == "env://":
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    else:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
    try:
        joined = time.perf_counter() - start
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        return {"init_method": init_method.split("?")[0], "rank": dist.get_rank(),
                "world_size": dist.get_world_size(), "all_reduce": t.item(), "join_s": joined}
    finally:
        dist.destroy_process_group()
        del store  # the store's server stops with its last user: the port is free for the next demo


def loopback_store(init_method: str, world_size: int, timeout_s: float):
    """Rank 0's rendezvous store for ``tcp://`` and ``env://`` on a loopback address, or None.

    Given ``tcp://127.0.0.1:PORT``, torch's TCPStore still listens on every interface of the
    machine (0.0.0.0 and ::), where anyone on the network could reach it. ppkit keeps local-mode
    sockets on 127.0.0.1, so rank 0 serves the store from a socket bound there, and the
    ``init_process_group`` call reuses that server (torch shares a port's server in a process).
    Across machines you want torch's default: the other machines must reach the store.
    """
    if init_method == "env://":
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    elif init_method.startswith("tcp://"):
        parsed = urlparse(init_method)
        host, port = parsed.hostname or "", parsed.port or 0
    else:
        return None
    if not ifaces.is_loopback(host) or sys.platform == "win32":  # no listen socket to hand over there
        return None
    return worker_setup.tcp_store(host, world_size, timeout_s, port=port, multi_tenant=True)


# -- samplers and DataParallel ------------------------------------------------------------------

def sampler_assignment(dataset_len: int, world_size: int, shuffle: bool = False, epoch: int = 0,
                       seed: int = 0) -> list[list[int]]:
    """The indices ``DistributedSampler`` gives each rank (no process group needed to ask)."""
    out = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(dataset_len), num_replicas=world_size, rank=rank,
                                     shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def data_parallel_here() -> dict:
    """What ``nn.DataParallel`` does on this machine: which devices it would split the batch over. Asked in a
    fresh Python (``data_parallel_in_this_process``): with GPUs, DataParallel moves the model to cuda:0, and the
    kernel keeps no CUDA context of its own."""
    return gpus.in_fresh_process("ppkit.lessons.data_parallel", "data_parallel_in_this_process")


def data_parallel_in_this_process() -> dict:
    """What ``nn.DataParallel`` does in this process (with GPUs: initialises CUDA here)."""
    model = make_model(0)
    x, _ = make_batch(8)
    with torch.no_grad():
        plain = model(x)  # first: with a single GPU, DataParallel moves the model itself to cuda:0
        wrapped = nn.DataParallel(model)
        out = wrapped(x)  # with GPUs: x scattered over them, outputs gathered on cuda:0
    # equal on the CPU (it just calls the model); on GPUs, equal up to float rounding of other kernels
    same = torch.allclose(out.cpu(), plain, rtol=1e-4, atol=1e-5)
    return {"cuda_available": torch.cuda.is_available(), "device_ids": list(wrapped.device_ids),
            "output_device": str(out.device), "output_equals_plain_model": same}


def ddp_step_here(rank: int, world_size: int) -> str:
    """03 on GPUs: one DDP step of the lesson's model on this rank's GPU (``device_ids=[rank]``, nccl) where each
    rank has one, else on the CPU over gloo; says where, and whether the ranks' gradients came out equal."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    backend = gpus.rank_backend(world_size)
    device = gpus.rank_device(rank, backend)
    group = dist.new_group(backend=backend)
    model = DDP(make_model(0).to(device), device_ids=[rank] if device.type == "cuda" else None,
                process_group=group)
    x, y = make_batch(8 * world_size)
    shard = slice(rank * 8, rank * 8 + 8)
    F.cross_entropy(model(x[shard].to(device)), y[shard].to(device)).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(gathered, grads, group=group)
    dist.destroy_process_group(group)
    return f"{backend} on {device.type}, gradients equal on every rank: {all(torch.equal(g, grads) for g in gathered)}"
