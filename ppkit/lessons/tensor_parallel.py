"""Lesson 10, tensor parallelism: one layer's matrices split over the ranks (Megatron-LM's scheme).

    ColumnParallelLinear  rank r keeps rows r of W (its output features); the input is copied to all
    RowParallelLinear     rank r keeps columns r of W; partial outputs are summed with one all_reduce
    ParallelMLP           column then row: one all_reduce forward, one backward (the input's gradient)
    ParallelAttention     split by heads: q, k, v column-parallel, the output projection row-parallel

Two autograd functions carry all the communication (Megatron's f and g): ``copy_to_parallel`` is the
identity forward and an all_reduce of the gradient backward; ``reduce_from_parallel`` is an all_reduce
forward and the identity backward. ``AllReduceLog`` records every call, per layer and direction.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppkit.errors import ConfigError

D_MODEL, HIDDEN, HEADS, BATCH, TOKENS = 8, 32, 4, 2, 3


class AllReduceLog:
    """Every all_reduce the hand-written layers make: (layer, "forward" | "backward", bytes)."""

    def __init__(self):
        self.calls: list[tuple[str, str, int]] = []

    def all_reduce(self, tensor: torch.Tensor, where: str, direction: str) -> torch.Tensor:
        dist.all_reduce(tensor)
        self.calls.append((where, direction, tensor.nbytes))
        return tensor


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, log, where):
        ctx.log, ctx.where = log, where
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # every rank used x: its gradient is the sum of theirs
        return ctx.log.all_reduce(grad.clone(), ctx.where, "backward"), None, None


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, log, where):
        return log.all_reduce(partial.clone(), where, "forward")

    @staticmethod
    def backward(ctx, grad):  # the sum's gradient reaches every partial unchanged
        return grad, None, None


def copy_to_parallel(x, log: AllReduceLog, where: str):
    return _CopyToParallel.apply(x, log, where)


def reduce_from_parallel(partial, log: AllReduceLog, where: str):
    return _ReduceFromParallel.apply(partial, log, where)


def part(size: int, rank: int, world_size: int, what: str) -> slice:
    """Rank ``rank``'s contiguous slice of ``size`` features."""
    if size % world_size:
        raise ConfigError(f"{what} has {size} features, which {world_size} ranks cannot split evenly; "
                          f"pick a tensor-parallel degree that divides {size}.")
    n = size // world_size
    return slice(rank * n, (rank + 1) * n)


class ColumnParallelLinear(nn.Module):
    """Rank r's output features of ``full``: y[..., part r] = x @ W[part r].T + b[part r]."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int, log: AllReduceLog, name: str = "column",
                 copy_input: bool = True):
        super().__init__()
        rows = part(full.out_features, rank, world_size, name)
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone())
        self.log, self.name, self.copy_input = log, name, copy_input

    def forward(self, x):
        if self.copy_input:
            x = copy_to_parallel(x, self.log, self.name)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Rank r's input features of ``full``: y = sum over r of x[..., part r] @ W[:, part r].T, + b once."""

    def __init__(self, full: nn.Linear, rank: int, world_size: int, log: AllReduceLog, name: str = "row"):
        super().__init__()
        cols = part(full.in_features, rank, world_size, name)
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())  # added after the sum, so only once
        self.log, self.name = log, name

    def forward(self, x_part):
        return reduce_from_parallel(F.linear(x_part, self.weight), self.log, self.name) + self.bias


class MLP(nn.Module):
    """The unsplit block: Linear(d, hidden), GELU, Linear(hidden, d)."""

    def __init__(self, d_model: int = D_MODEL, hidden: int = HIDDEN, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2 = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelMLP(nn.Module):
    def __init__(self, full: MLP, rank: int, world_size: int, log: AllReduceLog):
        super().__init__()
        self.fc1 = ColumnParallelLinear(full.fc1, rank, world_size, log, "fc1")
        self.fc2 = RowParallelLinear(full.fc2, rank, world_size, log, "fc2")

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # GELU acts element by element: on my features only


def attend(x, q, k, v, head_dim: int):
    """Multi-head attention of x through the projections q, k, v, heads concatenated again.
    ``view(..., -1, head_dim)`` lets the same code run on a rank that holds only some of the heads
    (torchtitan does the same)."""
    b, t, _ = x.shape

    def heads(proj):
        return proj(x).view(b, t, -1, head_dim).transpose(1, 2)  # (batch, heads, tokens, head_dim)

    out = F.scaled_dot_product_attention(heads(q), heads(k), heads(v))
    return out.transpose(1, 2).reshape(b, t, -1)


class Attention(nn.Module):
    """Unsplit multi-head self-attention on (batch, tokens, d_model)."""

    def __init__(self, d_model: int = D_MODEL, heads: int = HEADS, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.head_dim = d_model // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        return self.o(attend(x, self.q, self.k, self.v, self.head_dim))


class ParallelAttention(nn.Module):
    """Rank r computes heads r·H/n .. (r+1)·H/n: their rows of q, k, v and their columns of o."""

    def __init__(self, full: Attention, rank: int, world_size: int, log: AllReduceLog):
        super().__init__()
        part(full.q.out_features // full.head_dim, rank, world_size, "the heads")
        self.head_dim = full.head_dim
        self.q, self.k, self.v = (ColumnParallelLinear(getattr(full, n), rank, world_size, log, n, copy_input=False)
                                  for n in "qkv")
        self.o = RowParallelLinear(full.o, rank, world_size, log, "o")
        self.log = log

    def forward(self, x):
        x = copy_to_parallel(x, self.log, "qkv")  # once for q, k and v together
        return self.o(attend(x, self.q, self.k, self.v, self.head_dim))


# -- checks: each split equals the unsplit module, forward and backward ----------------------

def _inputs(seed: int = 1, d_model: int = D_MODEL):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, TOKENS, d_model, generator=g)
    upstream = torch.randn(BATCH, TOKENS, d_model, generator=g)  # the loss is (y * upstream).sum()
    return x, upstream


def my_part(full: torch.Tensor, mine: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """The part of ``full`` that ``mine`` holds: its rows, its columns, or all of it."""
    for dim in range(full.dim()):
        if full.shape[dim] != mine.shape[dim]:
            return full.narrow(dim, rank * mine.shape[dim], mine.shape[dim])
    return full


def _diff(a, b) -> float:
    return float((a.detach() - b.detach()).abs().max())


def compare(rank, world_size, block: str = "mlp") -> dict:
    """Run the unsplit ``block`` ("column", "row", "mlp", "attention") and this rank's part of it
    on the same input and upstream gradient; the largest differences and the all_reduces made."""
    log = AllReduceLog()
    if block in ("column", "row"):
        torch.manual_seed(0)
        full = nn.Linear(D_MODEL, D_MODEL)
        split = (ColumnParallelLinear if block == "column" else RowParallelLinear)(full, rank, world_size, log, block)
    elif block == "mlp":
        full = MLP()
        split = ParallelMLP(full, rank, world_size, log)
    elif block == "attention":
        full = Attention()
        split = ParallelAttention(full, rank, world_size, log)
    else:
        raise ConfigError(f"no block {block!r}: pick column, row, mlp or attention.")
    x, upstream = _inputs()
    xs = x.clone().requires_grad_()
    y = full(xs)
    (y * upstream).sum().backward()
    cols = part(D_MODEL, rank, world_size, block)
    x_mine = (x[..., cols] if block == "row" else x).clone().requires_grad_()
    y_mine = split(x_mine)
    want_y, want_up = (y[..., cols], upstream[..., cols]) if block == "column" else (y, upstream)
    (y_mine * want_up).sum().backward()
    want_x_grad = xs.grad[..., cols] if block == "row" else xs.grad
    full_params = dict(full.named_parameters())
    grad_diff = max(_diff(p.grad, my_part(full_params[name].grad, p, rank, world_size))
                    for name, p in split.named_parameters())
    return {"forward": _diff(y_mine, want_y), "input_grad": _diff(x_mine.grad, want_x_grad),
            "param_grads": grad_diff, "all_reduces": log.calls,
            "param_bytes": sum(p.nbytes for p in split.parameters())}


def comm_formula(block: str, world_size: int, tokens: int = BATCH * TOKENS, d_model: int = D_MODEL) -> dict:
    """All_reduces of one forward and backward, and the bytes each rank sends for them (ring:
    2(n-1)/n of the tensor). Each all_reduce moves a (tokens, d_model) fp32 activation."""
    count = {"column": 1, "row": 1, "mlp": 2, "attention": 2}[block]
    size = tokens * d_model * 4
    return {"all_reduces": count, "bytes_each": size, "sent_bytes": count * 2 * (world_size - 1) / world_size * size}


def mlp_memory_formula(degree: int, d_model: int = D_MODEL, hidden: int = HIDDEN,
                       tokens: int = BATCH * TOKENS) -> dict[str, float]:
    """Bytes one rank holds for the MLP block at tensor-parallel degree ``degree`` (fp32): the
    weights (fc1's rows and bias part, fc2's columns and its whole bias) and the hidden activation."""
    return {"weights": 4 * (2 * d_model * hidden / degree + hidden / degree + d_model),
            "activation": 4 * tokens * hidden / degree}


# -- the same with DTensor ------------------------------------------------------------------

def dtensor_compare(rank, world_size, block: str = "mlp") -> dict:
    """``parallelize_module`` with ColwiseParallel/RowwiseParallel on the block: its output, input
    gradient and local weight shards against the hand-written split, and the collectives
    ``CommDebugMode`` counted in each layer, forward and backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    if block == "mlp":
        full, hand_full = MLP(), MLP()
        plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        hand = ParallelMLP(hand_full, rank, world_size, AllReduceLog())
    elif block == "attention":
        full, hand_full = Attention(), Attention()
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()}
        hand = ParallelAttention(hand_full, rank, world_size, AllReduceLog())
    else:
        raise ConfigError(f"no DTensor plan for {block!r}: pick mlp or attention.")
    parallelize_module(full, mesh, plan)
    x, upstream = _inputs()
    x_torch, x_hand = x.clone().requires_grad_(), x.clone().requires_grad_()
    mode = CommDebugMode()
    with mode:
        y_torch = full(x_torch)
        (y_torch * upstream).sum().backward()
    y_hand = hand(x_hand)
    (y_hand * upstream).sum().backward()
    y_torch = y_torch.wait() if hasattr(y_torch, "wait") else y_torch
    hand_params = dict(hand.named_parameters())
    shards = max(_diff(p.to_local(), hand_params[name].detach()) for name, p in full.named_parameters())
    per_layer = {}
    for fqn, counts in mode.comm_module_counts.items():
        layer = fqn.split(".", 1)[1] if "." in fqn else None
        if layer in plan:
            per_layer[layer] = {d: sum(counts[d].values()) for d in ("forward", "backward")}
    return {"forward": _diff(y_torch, y_hand), "input_grad": _diff(x_torch.grad, x_hand.grad),
            "weight_shards": shards, "per_layer": per_layer, "total": mode.get_total_counts()}
