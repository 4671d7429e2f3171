"""Lesson 9, sharded data parallel: ZeRO-1, -2 and -3 by hand from reduce_scatter and all_gather.

Every stage trains notebook 03's classifier (``data_parallel.make_model``) with Adam on each rank's
shard of the batch, exactly as DDP would, and ends with the same weights; what differs is what each
rank keeps and what it sends:

    stage 0  plain data parallel: all_reduce every gradient, everyone runs the whole optimizer
    stage 1  + optimizer state sharded: reduce_scatter the gradients, update my slice, all_gather it
    stage 2  + gradients sharded: reduce_scatter each gradient as soon as backward produces it, free it
    stage 3  + parameters sharded: all_gather a layer's weights just before forward and backward use it

Each parameter is flattened and padded to a multiple of the world size; rank r owns slice r of it.
``memory_formula`` and ``comm_formula`` are the ZeRO paper's counts (fp32, Adam: 4 + 4 + 8 bytes per
parameter); ``train`` measures the same quantities on the real tensors and collectives.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppkit.errors import ConfigError
from ppkit.lessons import data_parallel as dp

STAGES = (0, 1, 2, 3)
LR = 0.01
BYTES = {"params": 4, "grads": 4, "optimizer": 8}  # fp32 weights, fp32 gradients, Adam's two moments
COMM_FACTOR = {0: 2, 1: 2, 2: 2, 3: 3}  # full-size tensors each rank reduce-scatters/all-gathers per step


def check_stage(stage) -> None:
    if stage not in STAGES:
        raise ConfigError(f"ZeRO stage {stage!r} does not exist: pick one of {STAGES} "
                          "(0 = plain data parallel, 3 = parameters sharded too).")


def num_params(model: nn.Module | None = None) -> int:
    """Ψ, the number of parameters (of notebook 03's classifier by default: 131)."""
    return sum(p.numel() for p in (model or dp.make_model()).parameters())


def memory_formula(psi: int, world_size: int, stage: int) -> dict[str, float]:
    """Bytes each rank holds, by the ZeRO paper's formulas (no padding, no activations)."""
    check_stage(stage)
    n = world_size
    return {"params": BYTES["params"] * psi / (n if stage >= 3 else 1),
            "grads": BYTES["grads"] * psi / (n if stage >= 2 else 1),
            "optimizer": BYTES["optimizer"] * psi / (n if stage >= 1 else 1)}


def comm_formula(psi: int, world_size: int, stage: int) -> float:
    """Bytes each rank sends per step with ring collectives: a reduce_scatter or an all_gather of S
    bytes sends (n-1)/n * S from each rank, an all_reduce twice that."""
    check_stage(stage)
    return COMM_FACTOR[stage] * (world_size - 1) / world_size * 4 * psi


# -- collectives that count what they send ----------------------------------------------------

# torch 2.14 renamed reduce_scatter_tensor/all_gather_into_tensor (the old names warn); older torch
# has only the old ones
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class Comm:
    """The three collectives ZeRO needs, each logged as (name, bytes of the full tensor)."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.calls: list[tuple[str, int]] = []

    def reduce_scatter_mean(self, full: torch.Tensor) -> torch.Tensor:
        """My slice of the average over ranks (sum, then divide, as DDP does)."""
        shard = torch.empty(full.numel() // self.world_size, dtype=full.dtype)
        _reduce_scatter(shard, full.contiguous(), op=dist.ReduceOp.SUM)
        self.calls.append(("reduce_scatter", full.nbytes))
        return shard.div_(self.world_size)

    def all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        full = torch.empty(shard.numel() * self.world_size, dtype=shard.dtype)
        _all_gather(full, shard.contiguous())
        self.calls.append(("all_gather", full.nbytes))
        return full

    def all_reduce_mean(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.calls.append(("all_reduce", tensor.nbytes))
        tensor.div_(self.world_size)

    def sent_bytes(self) -> float:
        """What a ring algorithm sends from this rank for the logged calls."""
        n = self.world_size
        return sum((2 if name == "all_reduce" else 1) * (n - 1) / n * size for name, size in self.calls)


def padded_flat(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """``tensor`` flattened and padded with zeros to a multiple of ``world_size``."""
    flat = tensor.detach().reshape(-1)
    pad = -flat.numel() % world_size
    return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat.clone()


def my_slice(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    size = full.numel() // world_size
    return full[rank * size:(rank + 1) * size]


def unflatten(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return full[:like.numel()].view_as(like)


# -- ZeRO-3's layer: weights gathered for forward, gathered again for backward -----------------

class GatheredLinear(torch.autograd.Function):
    """``F.linear`` on weights that exist only as slices. The full weight lives during this layer's
    forward and again during its backward, never in between; its gradient leaves as a slice."""

    @staticmethod
    def forward(ctx, x, w_shard, b_shard, comm, w_shape, b_shape):
        w = unflatten(comm.all_gather(w_shard), torch.empty(w_shape))
        b = unflatten(comm.all_gather(b_shard), torch.empty(b_shape))
        ctx.save_for_backward(x, w_shard)  # the slice, not the full weight
        ctx.comm, ctx.w_shape = comm, w_shape
        return F.linear(x, w, b)

    @staticmethod
    def backward(ctx, grad_out):
        x, w_shard = ctx.saved_tensors
        comm, n = ctx.comm, ctx.comm.world_size
        w = unflatten(comm.all_gather(w_shard), torch.empty(ctx.w_shape))
        grad_w = comm.reduce_scatter_mean(padded_flat(grad_out.t() @ x, n))
        grad_b = comm.reduce_scatter_mean(padded_flat(grad_out.sum(0), n))
        return grad_out @ w, grad_w, grad_b, None, None, None


# -- training -------------------------------------------------------------------------------

def _nbytes(tensors) -> int:
    return sum(t.nbytes for t in tensors if t is not None)


def _optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    # Adam's exp_avg and exp_avg_sq; its per-tensor "step" counters (4 bytes each) are left out
    return sum(v.nbytes for state in opt.state.values() for k, v in state.items() if k != "step")


def train(rank, world_size, stage: int = 1, steps: int = 3, lr: float = LR, batch_size: int = 24,
          seed: int = 0) -> dict:
    """``steps`` Adam steps of ZeRO-``stage`` by hand on this rank's shard of the batch.

    Returns the full parameters at the end (gathered once more for stage 3, outside the counts),
    the bytes this rank held (parameters and gradients at the end of backward, optimizer state after
    the step), the collectives of one step and the bytes they sent, and the losses.
    """
    check_stage(stage)
    dp.check_even(batch_size, world_size)
    n = world_size
    x, y = dp.make_batch(batch_size)
    mine = dp.shard_indices(batch_size, rank, world_size)
    x, y = x[mine], y[mine]
    model = dp.make_model(seed)
    names = [name for name, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    full = {name: padded_flat(p, n) for name, p in model.named_parameters()}
    if stage == 3:  # nobody keeps a full weight: only my slices, which the optimizer updates
        owned = [nn.Parameter(my_slice(full[name], rank, n).clone()) for name in names]
        model, full = None, {}
    else:
        for name, p in model.named_parameters():  # the module's weights become views of the padded buffers
            p.data = unflatten(full[name], p)
        # stage 0: the optimizer updates every weight; 1 and 2: only my slice of each (views, no copy)
        owned = ([nn.Parameter(my_slice(full[name], rank, n)) for name in names] if stage
                 else list(model.parameters()))
    opt = torch.optim.Adam(owned, lr=lr)
    comm = Comm(n)
    grad_shards: dict[str, torch.Tensor] = {}
    if stage == 2:
        for name, p in model.named_parameters():
            p.register_post_accumulate_grad_hook(functools.partial(_reduce_now, comm, grad_shards, name))
    losses = []
    for _ in range(steps):
        comm.calls.clear()
        grad_shards.clear()
        opt.zero_grad(set_to_none=True)
        if stage == 3:
            loss = F.cross_entropy(_forward_zero3(x, owned, shapes, comm), y)  # backward reduce-scatters
        else:
            model.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y)
        loss.backward()  # stage 2's hooks reduce-scatter during this call
        losses.append(loss.item())
        # held at the end of backward: full gradients (stages 0 and 1) or only my slices (2 and 3)
        grads = owned if stage == 3 else model.parameters()
        grads_held = _nbytes([*grad_shards.values(), *(p.grad for p in grads)])
        if stage == 0:
            for p in model.parameters():
                comm.all_reduce_mean(p.grad)
        elif stage == 1:
            for name, p in model.named_parameters():
                grad_shards[name] = comm.reduce_scatter_mean(padded_flat(p.grad, n))
        if stage in (1, 2):
            for name, p in zip(names, owned):
                p.grad = grad_shards[name]
        params_held = _nbytes(full.values()) if stage < 3 else _nbytes(owned)
        opt.step()
        if stage in (1, 2):
            for name, p in zip(names, owned):  # everyone gets everyone's updated slice back
                full[name].copy_(comm.all_gather(p.detach()))
        held = {"params": params_held, "grads": grads_held, "optimizer": _optimizer_bytes(opt)}
    step_calls, sent = list(comm.calls), comm.sent_bytes()
    if stage == 3:
        final = {name: comm.all_gather(p.detach())[:shape.numel()].view(shape)
                 for name, p, shape in zip(names, owned, shapes)}
    else:
        final = {name: p.detach().clone() for name, p in model.named_parameters()}
    return {"params": final, "held": held, "calls": step_calls, "sent_bytes": sent, "losses": losses}


def _reduce_now(comm, grad_shards, name, p):
    """ZeRO-2: as soon as autograd has p's whole gradient, keep my slice of the average, free the rest."""
    grad_shards[name] = comm.reduce_scatter_mean(padded_flat(p.grad, comm.world_size))
    p.grad = None  # gone before the next layer's gradient is computed


def _forward_zero3(x, owned, shapes, comm):
    """Notebook 03's classifier (Linear, Tanh, Linear) with every Linear gathered just in time."""
    for i in range(0, len(owned), 2):
        x = GatheredLinear.apply(x, owned[i], owned[i + 1], comm, shapes[i], shapes[i + 1])
        if i + 2 < len(owned):
            x = torch.tanh(x)
    return x


def ddp_train(rank, world_size, steps: int = 3, lr: float = LR, batch_size: int = 24, seed: int = 0):
    """The reference: DistributedDataParallel and torch.optim.Adam, the same steps."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dp.check_even(batch_size, world_size)
    model = dp.make_model(seed)
    net = DDP(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x, y = dp.make_batch(batch_size)
    mine = dp.shard_indices(batch_size, rank, world_size)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(x[mine]), y[mine]).backward()
        opt.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def max_difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)
