"""The exercise that ppkit checks for notebook 10's sequence parallelism: the row-parallel output as a sequence shard.

    check_sequence_shard_of_sum(fn)   fn(partial) -> this rank's tokens of the sum of every rank's ``partial``

Each rank holds a partial sum (batch, seq, d_model) of a row-parallel Linear's output, as under tensor
parallelism; with sequence parallelism each rank then needs only its own tokens of the sum: tokens
r * seq / n .. (r + 1) * seq / n on rank r, found with one reduce_scatter where TP's all_reduce gave every rank
all of them. The checker runs ``fn`` in fresh process groups of 2, 3 and 4 ranks (as ``check_sharding`` does)
and says which rank got what.
"""

from __future__ import annotations

import torch

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks

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
        got = fn(partial_of(rank).clone())
    except NotImplementedError:
        return NOT_WRITTEN
    return got.detach().clone() if isinstance(got, torch.Tensor) else got


def _same(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got.float(), want)


def _problem(k: int, rank: int, got) -> str | None:
    total = sum(partial_of(r) for r in range(k))
    want = total[:, _tokens(rank, k)]
    label = f"rank {rank} of {k}"
    if _same(got, want):
        return None
    if _same(got, total):
        return (f"{label} returned all {SEQ} tokens of the sum: that is TP's all_reduce; with sequence parallelism "
                f"each rank keeps only its own {SEQ // k} (a reduce_scatter)")
    if _same(got, partial_of(rank)[:, _tokens(rank, k)]):
        return f"{label} returned its own partial sum's tokens: the ranks' partial sums are not added up"
    for other in range(k):
        if other != rank and _same(got, total[:, _tokens(other, k)]):
            return f"{label} got the tokens of rank {other}: rank r's shard is tokens r * seq / n onwards"
    shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
    return f"{label} returned {shape}, not its tokens of the sum, shape {tuple(want.shape)}, e.g. {want[0, 0].tolist()}"


def check_sequence_shard_of_sum(fn, world_sizes=(2, 3, 4), timeout: float = 30,
                                cluster: Cluster | None = None) -> CheckReport | None:
    """Check ``fn(partial)`` on 2, 3 and 4 ranks: rank r must return tokens r of the sum of all partials."""
    check_callable(fn, "fn(partial)")

    def problems(k, results):
        return (_problem(k, rank, got) for rank, got in enumerate(results))

    return check_on_ranks(CheckReport("sequence shard of the sum"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k}, partial sums {BATCH}x{SEQ}x{D_MODEL}", _job, (fn,), problems)
