"""Lesson 12, expert parallelism by hand: the experts spread over the ranks, each token sent to the
ranks of its experts and its results sent back, with ``all_to_all_single`` and uneven split sizes.

    exchange_counts(tokens_per_expert, group)      what each rank will send to my experts (counts first)
    dispatch_splits(tokens_per_expert, world_size) (input_splits, output_splits) of the dispatch
    AllToAll.apply(x, output_splits, input_splits, ...)  all_to_all_single with a backward: the same
                                                   collective with the splits swapped
    ep_moe_layer(x, p, s, ...)                     the MoE layer with only this rank's experts
    compare(rank, world_size, ...)                 against ``moe.reference`` in one process

One step on rank r: route its tokens (the router is replicated); sort its kept (token, choice) pairs by
expert, so that the pairs for each rank's experts are contiguous (rank q holds experts q x n .. q x n + n
- 1); tell every rank how many pairs it will get for each of its experts (an all_to_all of E counts);
send the token rows (dispatch); run each local expert on the rows it got; send the results back the way
they came (combine); add each result, times its gate, into its token's output. Only kept pairs travel:
the bytes sent are the counted pairs x hidden x element size, in each direction.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError
from ppkit.lessons.moe import Parameters, Routing, expert_mlp, parameters, reference, route, settings, tokens

# The same products as the one-process layer, summed in other orders (the batched expert matmuls, the
# index_add of a token's k results, the router's gradient all_reduced): only rounding differs. Differences
# are relative to the largest value of the reference; measured at most ~5e-7 (float32) and ~4e-16
# (float64) here; the tests and the notebook hold them to these bounds.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


class AllToAllLog:
    """Every all_to_all_single of the layer: what it carried, which direction, the bytes this rank
    handed to it and the part of them addressed to other ranks."""

    def __init__(self):
        self.calls: list[dict] = []

    def record(self, what: str, direction: str, sent: torch.Tensor, input_splits, me: int) -> None:
        row = sent.element_size() * math.prod(sent.shape[1:])
        self.calls.append({"what": what, "direction": direction, "rows": int(sent.shape[0]),
                           "bytes": sent.nbytes, "off_rank": sent.nbytes - int(input_splits[me]) * row})

    def total(self, key: str = "bytes", what=("dispatch", "combine"), direction=None) -> int:
        return sum(c[key] for c in self.calls if c["what"] in what and direction in (None, c["direction"]))


def _span(timeline, label: str, kind: str, phase: str):
    return timeline.span(label, kind=kind, phase=phase) if timeline is not None else nullcontext()


def _all_to_all(x, output_splits, input_splits, group, log, what, direction, timeline):
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    with _span(timeline, f"{what}" if direction == "forward" else f"{what} grad", "comm", direction):
        dist.all_to_all_single(out, x.contiguous(), list(output_splits), list(input_splits), group=group)
    if log is not None:
        log.record(what, direction, x, input_splits, dist.get_rank(group))
    return out


class AllToAll(torch.autograd.Function):
    """all_to_all_single that autograd can go through. Row i of the input went to some rank and came
    out there as some row j; its gradient is row j of the output's gradient, on that rank: the backward
    is the same collective with input and output splits swapped."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group=None, log=None, what="dispatch", timeline=None):
        ctx.args = (output_splits, input_splits, group, log, what, timeline)
        return _all_to_all(x, output_splits, input_splits, group, log, what, "forward", timeline)

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits, group, log, what, timeline = ctx.args
        return (_all_to_all(grad, input_splits, output_splits, group, log, what, "backward", timeline),
                None, None, None, None, None, None)


def _check_counts(counts: torch.Tensor, world_size: int) -> None:
    if counts.dim() != 1 or counts.numel() % world_size:
        raise ConfigError(f"tokens_per_expert has shape {tuple(counts.shape)}: it needs one count per expert, and "
                          f"the experts spread evenly over the {world_size} ranks (a multiple of {world_size} "
                          "counts).")


def exchange_counts(tokens_per_expert: torch.Tensor, group=None, log=None) -> torch.Tensor:
    """(ranks, experts per rank): row q is how many rows rank q will send to each of my experts. Only the
    senders know it, so before the tokens go, every rank sends each rank the counts for that rank's
    experts: an all_to_all of E numbers with equal splits."""
    world_size = dist.get_world_size(group)
    _check_counts(tokens_per_expert, world_size)
    received = torch.empty_like(tokens_per_expert)
    dist.all_to_all_single(received, tokens_per_expert, group=group)
    if log is not None:
        log.record("counts", "forward", tokens_per_expert, [tokens_per_expert.numel() // world_size] * world_size,
                   dist.get_rank(group))
    return received.view(world_size, -1)


def dispatch_splits(tokens_per_expert, world_size, group=None):
    """The split sizes of the dispatch (the notebook's exercise): rows this rank sends to each rank, the
    sum of its counts for that rank's experts; rows it receives from each rank, from the exchanged counts."""
    counts = torch.as_tensor(tokens_per_expert, dtype=torch.int64)
    _check_counts(counts, world_size)
    input_splits = counts.view(world_size, -1).sum(1)
    output_splits = exchange_counts(counts, group).sum(1)
    return input_splits.tolist(), output_splits.tolist()


def _local_experts(rows, received, w1, w2, timeline):
    """Each local expert on the rows it got, the results in the order the rows came (by source rank,
    then expert): rows from one source are sorted by expert, so row i belongs to expert ``local[i]``."""
    n = received.shape[1]
    with _span(timeline, "experts", "compute", "forward"):
        if n == 1:
            return expert_mlp(rows, w1[0], w2[0])
        local = torch.arange(n).repeat(received.shape[0]).repeat_interleave(received.flatten())
        by_expert = torch.argsort(local, stable=True)
        chunks = rows[by_expert].split(received.sum(0).tolist())
        out = torch.cat([expert_mlp(c, w1[j], w2[j]) for j, c in enumerate(chunks)])
        return out[torch.argsort(by_expert)]


def ep_moe_layer(x: torch.Tensor, p: Parameters, s, group=None, log: AllToAllLog | None = None,
                 timeline=None, splits_fn=None) -> tuple[torch.Tensor, Routing]:
    """The MoE layer on this rank's tokens ``x`` (tokens, hidden) with this rank's experts ``p``
    (``Parameters.local``): its output for ``x`` and its routing. Differentiable end to end.

    ``log`` (an ``AllToAllLog``) records every all_to_all; ``timeline`` (``lessons.timeline.Timeline``)
    the time of each phase. ``splits_fn(tokens_per_expert, world_size)``: computes the dispatch's split
    sizes instead of ``dispatch_splits`` (the whole world only; the notebook's exercise)."""
    world_size = dist.get_world_size(group)
    n = s.experts_per_rank(world_size)
    if p.w1.shape[0] != n:
        raise ConfigError(f"this rank holds the weights of {p.w1.shape[0]} experts, but {s.experts} experts over "
                          f"{world_size} ranks is {n} each: pass parameters(s).local(rank, {world_size}, s).")
    with _span(timeline, "route", "compute", "forward"):
        r = route(x, p.router, s)
        token, choice = r.keep.nonzero(as_tuple=True)
        ids = r.experts[token, choice]
        order = torch.argsort(ids, stable=True)    # by expert, hence by the rank that holds it
        token, choice, ids = token[order], choice[order], ids[order]
        counts = torch.bincount(ids, minlength=s.experts)
    with _span(timeline, "counts", "comm", "forward"):
        received = exchange_counts(counts, group, log)
        if splits_fn is None:
            input_splits, output_splits = counts.view(world_size, n).sum(1).tolist(), received.sum(1).tolist()
        else:
            input_splits, output_splits = (list(map(int, v)) for v in splits_fn(counts.clone(), world_size))
    rows = AllToAll.apply(x[token], output_splits, input_splits, group, log, "dispatch", timeline)
    results = _local_experts(rows, received, p.w1, p.w2, timeline)
    back = AllToAll.apply(results, input_splits, output_splits, group, log, "combine", timeline)
    with _span(timeline, "gather", "compute", "forward"):
        y = torch.zeros_like(x).index_add(0, token, back * r.gates[token, choice, None])
    return y, r


def _diff(a, b) -> float:
    """The largest difference relative to the largest value of the reference: gradients summed over many
    tokens are large, and their rounding grows with them."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) if a.numel() else 0.0


def compare(rank, world_size, aux_weight: float = 0.1, splits_fn=None, **options) -> dict:
    """Expert parallelism on this rank's tokens against ``moe.reference`` on every rank's tokens in this
    process, with the same weights and loss (sum of output x upstream + aux_weight x aux loss, per rank):
    the largest difference of the output, the auxiliary loss, and the gradients of the tokens, the router
    (all_reduced over the ranks, as data parallelism would) and this rank's experts. ``options``: the
    ``MoESettings`` (experts, top_k, capacity_factor, hidden, ffn, tokens, skew, dtype)."""
    s = settings(**options)
    s.experts_per_rank(world_size)
    full = parameters(s).trainable()
    groups = [tokens(s, r) for r in range(world_size)]
    xs = [x.clone().requires_grad_() for x, _ in groups]
    outs, routings = reference(xs, full, s)
    sum((y * up).sum() + aux_weight * r.aux_loss for y, (_, up), r in zip(outs, groups, routings)).backward()
    mine = parameters(s).local(rank, world_size, s).trainable()
    x = groups[rank][0].clone().requires_grad_()
    log = AllToAllLog()
    y, r = ep_moe_layer(x, mine, s, log=log, splits_fn=splits_fn)
    ((y * groups[rank][1]).sum() + aux_weight * r.aux_loss).backward()
    dist.all_reduce(mine.router.grad)
    n = s.experts_per_rank(world_size)
    own = slice(rank * n, (rank + 1) * n)
    ref = routings[rank]
    return {"forward": _diff(y, outs[rank]), "aux": _diff(r.aux_loss, ref.aux_loss),
            "d_tokens": _diff(x.grad, xs[rank].grad), "d_router": _diff(mine.router.grad, full.router.grad),
            "d_w1": _diff(mine.w1.grad, full.w1.grad[own]), "d_w2": _diff(mine.w2.grad, full.w2.grad[own]),
            "same_routing": bool(torch.equal(r.experts, ref.experts) and torch.equal(r.keep, ref.keep)),
            "dropped_pairs": r.dropped_pairs, "kept_pairs": int(r.keep.sum()), "bytes": log.total(),
            "rows_computed": next(c["rows"] for c in log.calls if c["what"] == "combine")}



# -- torch's own ---------------------------------------------------------------------------------

def against_torch(rank, world_size) -> dict:
    """``AllToAll`` against torch's two differentiable all_to_all_singles, on uneven splits with zeros:
    for each, whether output and input gradient are identical to ours, and the warnings it gave."""
    import warnings

    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.distributed.nn.functional import all_to_all_single

    input_splits = [(rank + 2 * q) % 3 for q in range(world_size)]  # some ranks get nothing from some others
    output_splits = [(q + 2 * rank) % 3 for q in range(world_size)]
    x = torch.randn(sum(input_splits), 5, generator=torch.Generator().manual_seed(rank))
    upstream = torch.randn(sum(output_splits), 5, generator=torch.Generator().manual_seed(10 + rank))
    ours = x.clone().requires_grad_()
    want = AllToAll.apply(ours, output_splits, input_splits)
    (want * upstream).sum().backward()
    theirs = {
        "torch.distributed.nn.functional.all_to_all_single": lambda t: all_to_all_single(
            torch.empty(sum(output_splits), 5), t, output_splits, input_splits),
        "torch.distributed._functional_collectives.all_to_all_single_autograd": lambda t: all_to_all_single_autograd(
            t, output_splits, input_splits, dist.group.WORLD),
    }
    found = {}
    for name, fn in theirs.items():
        mine = x.clone().requires_grad_()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = fn(mine)
            (got * upstream).sum().backward()
        found[name] = {"equal": bool(torch.equal(got, want) and torch.equal(mine.grad, ours.grad)),
                       "warnings": sorted({f"{w.category.__name__}: {str(w.message).splitlines()[0]}" for w in caught})}
    return found
