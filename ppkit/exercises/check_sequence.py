"""The exercise that ppkit checks for notebook 10's sequence parallelism: the row-parallel output as a sequence shard.

    check_sequence_shard_of_sum(fn)   fn(partial) -> this rank's tokens of the sum of every rank's ``partial``

Each rank holds a partial sum (batch, seq, d_model) of a row-parallel Linear's output, as under tensor
parallelism; with sequence parallelism each rank then needs only its own tokens of the sum: tokens
r * seq / n .. (r + 1) * seq / n on rank r, found with one reduce_scatter where TP's all_reduce gave every rank
all of them. The checker runs ``fn`` in fresh process groups of 2, 3 and 4 ranks (as ``check_sharding`` does),
says which rank got what, and counts the collectives ``fn`` called and the bytes they send
(``ppkit.exercises.traffic``): the right tokens by an all_reduce and a slice send twice what the reduce_scatter
sends, and that is named too.
"""

from __future__ import annotations

import torch

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks
from ppkit.exercises.traffic import Traffic, ring_bytes

BATCH, SEQ, D_MODEL = 2, 12, 3  # 12 tokens: 2, 3 and 4 ranks each get a whole number of them


def partial_of(rank: int) -> torch.Tensor:
    """Rank ``rank``'s partial sum: small integers, different on every rank, so every mistake shows."""
    g = torch.Generator().manual_seed(rank)
    return torch.randint(-5, 6, (BATCH, SEQ, D_MODEL), generator=g).float()


def _tokens(rank: int, k: int) -> slice:
    n = SEQ // k
    return slice(rank * n, (rank + 1) * n)


def _job(rank, k, fn):
    try:
        with Traffic(k) as seen:
            got = fn(partial_of(rank).clone())
    except NotImplementedError:
        return NOT_WRITTEN
    except RuntimeError as err:  # gloo's shape check: the same on every rank, so the group stays in step
        if "worldSize == inputShape[0]" not in str(err):
            raise
        return {"split_dim_0": str(err).strip().splitlines()[-1]}
    return {"got": got.detach().clone() if isinstance(got, torch.Tensor) else got,
            "calls": seen.calls, "sent": seen.sent(), "summary": seen.summary(), "names": seen.names()}


def _same(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got.float(), want)


def _wrong_value(k: int, rank: int, got) -> str | None:
    """None for the right tokens of the sum, else a sentence naming the mistake."""
    partials = torch.stack([partial_of(r) for r in range(k)])
    total = partials.sum(0)
    mine = _tokens(rank, k)
    want = total[:, mine]
    label = f"rank {rank} of {k}"
    if _same(got, want):
        return None
    if _same(got, total):
        return (f"{label} returned all {SEQ} tokens of the sum: that is TP's all_reduce; with sequence parallelism "
                f"each rank keeps only its own {SEQ // k} (a reduce_scatter)")
    if _same(got, partial_of(rank)[:, mine]):
        return f"{label} returned its own partial sum's tokens: the ranks' partial sums are not added up"
    if _same(got, want.transpose(0, 1).contiguous()):
        return (f"{label} returned its tokens as (seq, batch, d_model) {tuple(got.shape)}: transpose back to "
                f"(batch, seq // world_size, d_model) {tuple(want.shape)}")
    if k > 1 and _same(got, want / k):
        return (f"{label} returned the sum divided by world_size ({k}): a row-parallel Linear's output is the sum of "
                "the ranks' partial products, not their average (averaging is for gradients over data-parallel ranks)")
    for op, reduced in (("MAX", partials.amax(0)), ("MIN", partials.amin(0)), ("PRODUCT", partials.prod(0))):
        if _same(got, reduced[:, mine]):
            return f"{label} returned the element-wise {op} of the partial sums: reduce with op=dist.ReduceOp.SUM"
    batch = BATCH // k
    if k <= BATCH and _same(got, total[rank * batch:(rank + 1) * batch]):
        return (f"{label} returned batch row(s) {rank * batch}..{(rank + 1) * batch - 1} of the sum, all tokens: "
                "reduce_scatter splits dim 0, which is the batch here; the tokens are dim 1: move them first with "
                "partial.transpose(0, 1).contiguous()")
    for other in range(k):
        if other != rank and _same(got, total[:, _tokens(other, k)]):
            return f"{label} got the tokens of rank {other}: rank r's shard is tokens r * seq / n onwards"
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    return f"{label} returned {shape}, not its tokens of the sum, shape {tuple(want.shape)}, e.g. {want[0, 0].tolist()}"


def _too_much_traffic(k: int, rank: int, result) -> str | None:
    """None when the right tokens came with no more bytes than one reduce_scatter sends, else what was sent."""
    once = ring_bytes("reduce_scatter", BATCH * SEQ * D_MODEL * 4, k)
    sent, names = result["sent"], result["names"]
    if sent <= once * 1.001:
        return None
    label = f"rank {rank} of {k} got the right tokens, but"
    what = (f"sent {sent:,.0f} bytes ({result['summary']}) where one reduce_scatter sends {once:,.0f}: "
            f"{sent / once:.1f} times as much")
    if names == ["all_reduce"]:
        return (f"{label} you all-reduced the whole tensor and kept your slice: that sends twice what "
                f"reduce_scatter sends ({sent:,.0f} bytes per rank against {once:,.0f}), and every rank held all "
                f"{SEQ} tokens for a moment, the memory sequence parallelism saves. Use one reduce_scatter")
    if "all_gather" in names or "all_gather_into_tensor" in names:
        return (f"{label} gathering every rank's partial sum and adding them up {what}. One reduce_scatter adds "
                "as it goes and hands each rank only its block")
    return f"{label} {what}. One reduce_scatter is all it takes"


def check_sequence_shard_of_sum(fn, world_sizes=(2, 3, 4), timeout: float = 30,
                                cluster: Cluster | None = None) -> CheckReport | None:
    """Check ``fn(partial)`` on 2, 3 and 4 ranks: rank r must return tokens r of the sum of all partials, sending
    no more bytes than one reduce_scatter does."""
    check_callable(fn, "fn(partial)")

    def problems(k, results):
        for rank, result in enumerate(results):
            if "split_dim_0" in result:
                yield (f"rank {rank} of {k}: reduce_scatter cut dim 0 of its input into {k} blocks, and dim 0 is the "
                       f"batch ({BATCH} rows) here (gloo said: {result['split_dim_0']}); the tokens are dim 1: move "
                       "them first with partial.transpose(0, 1).contiguous()")
                continue
            yield _wrong_value(k, rank, result["got"]) or _too_much_traffic(k, rank, result)

    return check_on_ranks(CheckReport("sequence shard of the sum"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k}, partial sums {BATCH}x{SEQ}x{D_MODEL}", _job, (fn,), problems)
