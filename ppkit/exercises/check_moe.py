"""The exercise that ppkit checks for notebook 12: the split sizes of the MoE dispatch.

    check_dispatch_splits(fn)   fn(tokens_per_expert, world_size) -> (input_splits, output_splits)

``tokens_per_expert`` (int64, one count per expert) says how many of this rank's kept (token, choice)
pairs go to each expert; rank r holds experts r x n .. r x n + n - 1 (n = experts / world_size).
``input_splits[q]`` is how many rows this rank sends to rank q, ``output_splits[q]`` how many it will
receive from rank q: only rank q knows that, so the counts must be exchanged first. The checker runs
``fn`` on real ranks, in fresh process groups of 2, 3 and 4 ranks, with counts that leave some ranks
sending nothing to some others, and names the mistake (counts per expert rather than per rank, experts
dealt round-robin, output splits equal to the input splits, a wrong total).
"""

from __future__ import annotations

import torch

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks


def split_cases(world_size: int):
    """(name, counts): counts[r] is rank r's tokens_per_expert. Small integers with zeros: some ranks send
    nothing to some ranks, and in the second case rank 0 kept no pair at all."""
    g = torch.Generator().manual_seed(12 + world_size)
    spread = torch.randint(0, 6, (world_size, 12), generator=g)
    spread[1 % world_size, :12 // world_size] = 0  # rank 1 sends nothing to rank 0
    single = torch.randint(1, 9, (world_size, world_size), generator=g)
    single[0] = 0
    return [(f"12 experts ({12 // world_size} per rank)", spread),
            ("one expert per rank, rank 0 kept no pair", single)]


def expected(counts: torch.Tensor, rank: int) -> tuple[list[int], list[int]]:
    world_size = counts.shape[0]
    per_rank = counts.view(world_size, world_size, -1).sum(-1)  # [sender, receiver]
    return per_rank[rank].tolist(), per_rank[:, rank].tolist()


def _job(rank, k, fn):
    out = []
    for _, counts in split_cases(k):
        try:
            got = fn(counts[rank].clone(), k)
        except NotImplementedError:
            return NOT_WRITTEN
        out.append(type(got)(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in got)
                   if type(got) in (tuple, list) else got)
    return out


def _as_ints(value):
    """A list of ints, or None when ``value`` is not a sequence of whole numbers."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.is_floating_point() or value.is_complex():
            return None
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return list(value)


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r:.60}"


def _problem(label, counts, rank, got) -> str | None:
    k, experts = counts.shape
    n = experts // k
    want_in, want_out = expected(counts, rank)
    if not isinstance(got, (tuple, list)) or len(got) != 2 or _as_ints(got) is not None:
        return f"{label}: expected a pair (input_splits, output_splits), got {_kind(got)}: return both"
    lists = [_as_ints(v) for v in got]
    for name, value, ints in zip(("input_splits", "output_splits"), got, lists):
        if ints is None:
            return (f"{label}: {name} is {_kind(value)}; all_to_all_single takes split sizes as whole numbers, "
                    "one per rank: a list of ints (or an int64 tensor's .tolist())")
        if len(ints) == experts and experts != k:
            return (f"{label}: {name} has {experts} values, one per expert; all_to_all_single wants one per rank "
                    f"({k}): add up the counts of the {n} experts each rank holds")
        if len(ints) != k:
            return f"{label}: {name} has {len(ints)} values; it needs one per rank, {k}"
    got_in, got_out = lists
    if got_in != want_in:
        robin = [int(counts[rank][q::k].sum()) for q in range(k)]
        if got_in == robin and robin != want_in:
            return (f"{label}: input_splits {got_in} deals the experts out round-robin (expert e on rank e % "
                    f"{k}); here rank q holds the block of experts q x {n} .. q x {n} + {n - 1} (e // {n}), "
                    f"so input_splits is {want_in}")
        return (f"{label}: input_splits should be {want_in} (this rank's counts summed over each rank's "
                f"{n} experts), got {got_in}")
    if got_out == want_out:
        return None
    if got_out == want_in:
        return (f"{label}: output_splits equals input_splits ({got_out}), but what this rank receives is what "
                f"the others send it ({want_out}), which only they know: exchange the counts first with "
                "dist.all_to_all_single")
    if sum(got_out) == sum(want_out):
        return (f"{label}: output_splits {got_out} adds up to the right total, {sum(want_out)}, but entry q "
                f"must be what rank q sends this rank: {want_out}")
    return f"{label}: output_splits should be {want_out} (what ranks 0..{k - 1} send this rank), got {got_out}"


def check_dispatch_splits(fn, world_sizes=(2, 3, 4), timeout: float = 30,
                          cluster: Cluster | None = None) -> CheckReport | None:
    """Check ``fn(tokens_per_expert, world_size) -> (input_splits, output_splits)`` on real ranks (see the
    module's docstring); ``cluster``: one started with ``process_group=False`` to run on."""
    check_callable(fn, "fn(tokens_per_expert, world_size)")

    def problems(k, results):
        for rank, per_case in enumerate(results):
            for (name, counts), got in zip(split_cases(k), per_case):
                yield _problem(f"world_size {k}, {name}: rank {rank}", counts, rank, got)

    return check_on_ranks(CheckReport("dispatch split sizes"), fn, world_sizes, timeout, cluster,
                          lambda k: [f"world_size {k}, {name}" for name, _ in split_cases(k)], _job, (fn,), problems)
