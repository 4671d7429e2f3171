"""Lesson 10, sequence parallelism (Korthikanti et al. 2022): tensor parallelism's companion for what TP leaves whole.

Under tensor parallelism alone every rank holds the whole sequence at the LayerNorms, the dropouts and the
inputs of the column-parallel Linears. Sequence parallelism cuts those along the sequence: each rank runs the
norms (and dropout) on its shard of the tokens; an **all_gather** along the sequence before the column-parallel
Linear gives it the whole input; a **reduce_scatter** after the row-parallel Linear sums the partial outputs and
hands each rank its shard again (where TP's all_reduce gave everyone everything). An all_reduce is a
reduce_scatter plus an all_gather, so the matrices' bytes sent are TP's here (autograd keeps the gathered
inputs); Megatron-LM gathers them again in backward instead, 25 % more. SP also sums the gradients of the
norms and row biases over the ranks: small all_reduces that TP alone does not need.

    Block                 the unsplit block: pre-norm attention (lesson 10's Attention) and MLP, residuals
    TensorParallelBlock   TP only, by hand: norms on the whole sequence, lesson 10's ParallelAttention/ParallelMLP
    SequenceParallelBlock TP + SP, by hand: norms on the shard, all_gather before, reduce_scatter after
    compare               either against the unsplit block: output, input gradient, every parameter's gradient;
                          the collectives and bytes sent, and what autograd keeps (activation bytes per rank)
    dtensor_compare       the same block with torch's ``SequenceParallel``, ``PrepareModuleInput`` and
                          ``ColwiseParallel``/``RowwiseParallel(output_layouts=Shard(1))`` against the one by hand
    memory_formulas       the Playbook's per-layer activation bytes for TP and TP + SP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppkit.errors import ConfigError
from ppkit.lessons import step_memory as sm
from ppkit.lessons import tensor_parallel as tp

# torch 2.14 renamed reduce_scatter_tensor/all_gather_into_tensor (the old names warn); older torch has only those
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Size:
    d_model: int = 8
    hidden: int = 32
    heads: int = 4
    batch: int = 2
    seq: int = 8


SMALL = Size()                                          # for equality: fast
MEASURED = Size(d_model=64, hidden=256, heads=4, batch=2, seq=64)  # for memory: the activations dominate


class CommLog:
    """Every collective the hand-written blocks make: (layer, collective, direction, bytes this rank sends,
    ring algorithm: an all_gather or a reduce_scatter of S bytes over n ranks sends (n-1)/n S)."""

    def __init__(self):
        self.calls: list[tuple[str, str, str, float]] = []

    def add(self, where: str, collective: str, direction: str, full: torch.Tensor) -> None:
        n = dist.get_world_size()
        self.calls.append((where, collective, direction, (n - 1) / n * full.nbytes))


def gather_sequence(shard: torch.Tensor) -> torch.Tensor:
    """(b, s/n, h) on each rank -> (b, s, h), the ranks' shards in rank order."""
    n = dist.get_world_size()
    local = shard.transpose(0, 1).contiguous()  # the sequence first: the collectives work on dim 0
    full = local.new_empty((local.shape[0] * n, *local.shape[1:]))
    _all_gather(full, local)
    return full.transpose(0, 1).contiguous()  # contiguous: q, k and v then keep this one tensor, not a copy each


def scatter_sequence(full: torch.Tensor) -> torch.Tensor:
    """(b, s, h) partial sums on each rank -> this rank's (b, s/n, h) of their sum."""
    n = dist.get_world_size()
    local = full.transpose(0, 1).contiguous()
    shard = local.new_empty((local.shape[0] // n, *local.shape[1:]))
    _reduce_scatter(shard, local, op=dist.ReduceOp.SUM)
    return shard.transpose(0, 1)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, log, where):
        ctx.log, ctx.where = log, where
        full = gather_sequence(shard)
        log.add(where, "all_gather", "forward", full)
        return full

    @staticmethod
    def backward(ctx, grad):  # every rank used every token: my tokens' gradient is the sum over the ranks
        ctx.log.add(ctx.where, "reduce_scatter", "backward", grad)
        return scatter_sequence(grad), None, None


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, partial, log, where):
        ctx.log, ctx.where = log, where
        log.add(where, "reduce_scatter", "forward", partial)
        return scatter_sequence(partial)

    @staticmethod
    def backward(ctx, grad):  # the sum's gradient reaches every partial: all of it, from every shard
        full = gather_sequence(grad)
        ctx.log.add(ctx.where, "all_gather", "backward", full)
        return full, None, None


class Block(nn.Module):
    """The unsplit block: x + o(attention(norm1(x))), then x + fc2(gelu(fc1(norm2(x)))), on (b, s, h)."""

    def __init__(self, size: Size = SMALL, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.norm1, self.norm2 = nn.LayerNorm(size.d_model), nn.LayerNorm(size.d_model)
        self.attn = tp.Attention(size.d_model, size.heads, seed=seed + 1)
        self.mlp = tp.MLP(size.d_model, size.hidden, seed=seed + 2)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TensorParallelBlock(nn.Module):
    """TP only: the norms and residuals on the whole sequence on every rank; lesson 10's split layers."""

    def __init__(self, full: Block, rank: int, world_size: int, log: tp.AllReduceLog):
        super().__init__()
        self.norm1, self.norm2 = (_copy(n) for n in (full.norm1, full.norm2))
        self.attn = tp.ParallelAttention(full.attn, rank, world_size, log)
        self.mlp = tp.ParallelMLP(full.mlp, rank, world_size, log)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SequenceParallelBlock(nn.Module):
    """TP + SP: x is this rank's shard of the sequence, (b, s/n, h), and so is the output."""

    def __init__(self, full: Block, rank: int, world_size: int, log: CommLog, dropout: float = 0.0):
        super().__init__()
        self.norm1, self.norm2, self.log, self.p = _copy(full.norm1), _copy(full.norm2), log, dropout
        self.head_dim = full.attn.head_dim
        self.q, self.k, self.v = (tp.ColumnParallelLinear(getattr(full.attn, n), rank, world_size,
                                                          tp.AllReduceLog(), n, copy_input=False) for n in "qkv")
        self.fc1 = tp.ColumnParallelLinear(full.mlp.fc1, rank, world_size, tp.AllReduceLog(), "fc1", copy_input=False)
        self.o_weight, self.o_bias = _row_part(full.attn.o, rank, world_size)
        self.fc2_weight, self.fc2_bias = _row_part(full.mlp.fc2, rank, world_size)

    def forward(self, x):
        whole = _Gather.apply(self.norm1(x), self.log, "attention")      # norm on my tokens, then all of them
        heads = tp.attend(whole, self.q, self.k, self.v, self.head_dim)   # my heads, every token
        out = _Scatter.apply(F.linear(heads, self.o_weight), self.log, "attention") + self.o_bias
        x = x + F.dropout(out, self.p, self.training)                      # dropout on my tokens only
        whole = _Gather.apply(self.norm2(x), self.log, "mlp")
        out = _Scatter.apply(F.linear(F.gelu(self.fc1(whole)), self.fc2_weight), self.log, "mlp") + self.fc2_bias
        return x + F.dropout(out, self.p, self.training)


def _copy(norm: nn.LayerNorm) -> nn.LayerNorm:
    new = nn.LayerNorm(norm.normalized_shape)
    new.load_state_dict(norm.state_dict())
    return new


def _row_part(full: nn.Linear, rank: int, world_size: int):
    cols = tp.part(full.in_features, rank, world_size, "the row-parallel layer")
    return nn.Parameter(full.weight.detach()[:, cols].clone()), nn.Parameter(full.bias.detach().clone())


def check_size(size: Size, world_size: int) -> Size:
    if size.seq % world_size or size.heads % world_size or size.hidden % world_size:
        raise ConfigError(f"{world_size} ranks cannot split a sequence of {size.seq} tokens, {size.heads} heads and "
                          f"{size.hidden} hidden features evenly; pick a number of ranks that divides all three.")
    return size


def _inputs(size: Size):
    g = torch.Generator().manual_seed(1)
    shape = (size.batch, size.seq, size.d_model)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)  # x, and the loss's (y * up).sum()


def _diff(a, b) -> float:
    return float((a.detach() - b.detach()).abs().max())


def compare(rank: int, world_size: int, mode: str = "sp", size: Size = SMALL) -> dict:
    """The unsplit block and this rank's TP ("tp") or TP + SP ("sp") block on the same input and upstream
    gradient: the largest differences (output, input gradient, parameter gradients, each on the part the
    rank holds), the collectives made, and the activation bytes autograd keeps on this rank; ``grad_syncs``: the
    bytes of each all_reduce that sums a replicated parameter's gradient under SP (none under TP)."""
    check_size(size, world_size)
    full = Block(size)
    x, upstream = _inputs(size)
    xs = x.clone().requires_grad_()
    y = full(xs)
    (y * upstream).sum().backward()
    tokens = tp.part(size.seq, rank, world_size, "the sequence") if mode == "sp" else slice(None)
    if mode == "sp":
        log = CommLog()
        split = SequenceParallelBlock(full, rank, world_size, log)
    elif mode == "tp":
        log = tp.AllReduceLog()
        split = TensorParallelBlock(full, rank, world_size, log)
    else:
        raise ConfigError(f"no mode {mode!r}: pick 'tp' (tensor parallel) or 'sp' (tensor + sequence parallel).")
    x_mine = x[:, tokens].clone().requires_grad_()
    with sm.SavedTensors(split) as saved:
        y_mine = split(x_mine)
    (y_mine * upstream[:, tokens]).sum().backward()
    grad_syncs = []  # bytes this rank sends for each: the norms and row biases, replicated, saw my tokens only
    if mode == "sp":  # so their gradient is the sum of the ranks' (one all_reduce each, as Megatron-LM does)
        for p in (*split.norm1.parameters(), *split.norm2.parameters(), split.o_bias, split.fc2_bias):
            dist.all_reduce(p.grad)
            grad_syncs.append(2 * (world_size - 1) / world_size * p.grad.nbytes)
    reference = {**dict(full.named_parameters()), **_sp_names(full)}
    grads = max(_diff(p.grad, tp.my_part(reference[name].grad, p, rank, world_size))
                for name, p in split.named_parameters())
    calls = log.calls if mode == "sp" else [(w, "all_reduce", d, 2 * (world_size - 1) / world_size * n)
                                             for w, d, n in log.calls]
    return {"forward": _diff(y_mine, y[:, tokens]), "input_grad": _diff(x_mine.grad, xs.grad[:, tokens]),
            "param_grads": grads, "calls": calls, "sent": sum(c[3] for c in calls), "grad_syncs": grad_syncs,
            "activation_bytes": saved.total()}


def _sp_names(full: Block) -> dict:
    """The unsplit parameters under the names SequenceParallelBlock gives them."""
    a, m = full.attn, full.mlp
    return {"q.weight": a.q.weight, "q.bias": a.q.bias, "k.weight": a.k.weight, "k.bias": a.k.bias,
            "v.weight": a.v.weight, "v.bias": a.v.bias, "fc1.weight": m.fc1.weight, "fc1.bias": m.fc1.bias,
            "o_weight": a.o.weight, "o_bias": a.o.bias, "fc2_weight": m.fc2.weight, "fc2_bias": m.fc2.bias}


def dropout_mask(rank: int, world_size: int, same_seed: bool, p: float = 0.5, size: Size = SMALL) -> torch.Tensor:
    """The dropout mask this rank draws for its shard of the tokens, (batch, seq / world_size, d_model): with
    ``same_seed`` every rank seeds alike (right where the ranks hold copies of one tensor, as TP's residual dropouts
    do), else with its rank (needed where they hold different tokens, as SP's do). The rank's RNG is left as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(0 if same_seed else 1000 + rank)
        return F.dropout(torch.ones(size.batch, size.seq // world_size, size.d_model), p).ne(0)
