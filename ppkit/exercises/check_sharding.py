"""Exercises that ppkit checks for notebooks 09 and 10; they run on real ranks, as in ``exercises``.

    check_zero2_grad_shard(fn)      lesson 9: this rank's slice of the averaged gradient, by reduce_scatter
    check_row_parallel_forward(fn)  lesson 10: a row-parallel Linear's forward, one all_reduce

Each starts its own ranks without a process group (or uses ``cluster=``, one started with
``process_group=False``), runs your function in fresh process groups of each world size, and returns a
``CheckReport`` when every rank got the right tensor; otherwise it raises ``ExerciseFailed`` saying which
rank got what wrong. A function that still raises ``NotImplementedError`` is reported as not written
yet, with no error.
"""

from __future__ import annotations

import torch

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks
from ppkit.exercises.traffic import Traffic, ring_bytes


def _close(got, want) -> bool:
    return isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
        got.double(), want.double(), rtol=1e-5, atol=1e-5)


def _describe(got) -> str:
    if not isinstance(got, torch.Tensor):
        return f"{type(got).__name__}, not a tensor"
    return f"shape {tuple(got.shape)}"


# -- lesson 9: ZeRO-2's gradient step ---------------------------------------------------------

GRAD_NUMELS = (12, 24)  # padded flat gradients: 2, 3 and 4 ranks divide both


def zero_grad_input(rank: int, numel: int) -> torch.Tensor:
    """Rank ``rank``'s flat gradient: small integers, so every order of summation is exact."""
    g = torch.Generator().manual_seed(100 * numel + rank)
    return torch.randint(-9, 10, (numel,), generator=g).float()


def _zero2_job(rank, k, fn, numels):
    out = []
    for numel in numels:
        try:
            with Traffic(k) as seen:
                got = fn(zero_grad_input(rank, numel), rank, k)
        except NotImplementedError:
            return NOT_WRITTEN
        out.append(_seen(got, seen))
    return out


def _seen(got, seen: Traffic) -> dict:
    """What a rank's job returns: its answer and what it sent to get it."""
    return {"got": got.detach().clone() if isinstance(got, torch.Tensor) else got,
            "all_reduce_calls": seen.names().count("all_reduce"), "sent": seen.sent(), "summary": seen.summary()}


def _zero2_problem(k, rank, numel, result) -> str | None:
    got, calls = result["got"], result["all_reduce_calls"]
    inputs = [zero_grad_input(r, numel) for r in range(k)]
    total = torch.stack(inputs).sum(0)
    size = numel // k

    def piece(t, r):
        return t[r * size:(r + 1) * size]

    label = f"world_size {k}, {numel} gradient values: rank {rank}"
    if calls:
        return (f"{label} called dist.all_reduce {calls} time(s): then every rank holds the whole averaged "
                "gradient, which ZeRO-2 exists to avoid; use dist.reduce_scatter_single (reduce_scatter_tensor "
                f"before torch 2.14) into a tensor of numel // world_size = {size} values")
    want = piece(total, rank) / k
    if _close(got, want):
        once = ring_bytes("reduce_scatter", numel * 4, k)
        if result["sent"] > once * 1.001:
            return (f"{label} got the right slice but sent {result['sent']:,.0f} bytes ({result['summary']}), where "
                    f"one reduce_scatter sends {once:,.0f}: it sums as it goes and hands each rank only its slice")
        return None
    if isinstance(got, torch.Tensor) and got.shape == total.shape:
        return (f"{label} returned the whole gradient ({numel} values); ZeRO-2 keeps only its own slice, "
                f"{size} values")
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"{label} returned {_describe(got)}, expected shape {tuple(want.shape)} (its slice)"
    if _close(got, want * k):
        return f"{label} holds the sum, {k} times too large: divide by world_size for the average"
    if _close(got, piece(inputs[rank], rank)):
        return f"{label} holds only its own gradient's slice: the other ranks' gradients were never added"
    others = [r for r in range(k) if r != rank and (_close(got, piece(total, r) / k) or _close(got, piece(total, r)))]
    if others:
        return f"{label} holds rank {others[0]}'s slice; slice r of the flat gradient belongs to rank r"
    return f"{label} is wrong: expected {want.tolist()}, got {got.tolist()}"


def check_zero2_grad_shard(fn, world_sizes=(2, 3, 4), numels=GRAD_NUMELS, timeout: float = 30,
                           cluster: Cluster | None = None) -> CheckReport | None:
    """Check ``fn(grad, rank, world_size) -> shard``: ``grad`` is this rank's flat gradient (its
    length a multiple of world_size); the result is this rank's slice r of the gradient averaged over
    all ranks, made with reduce_scatter (no all_reduce: the full average must never exist)."""
    check_callable(fn, "fn(grad, rank, world_size)")

    def problems(k, results):
        for rank, per_size in enumerate(results):
            for numel, r in zip(numels, per_size):
                yield _zero2_problem(k, rank, numel, r)

    return check_on_ranks(CheckReport("ZeRO-2 gradient step"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k} x gradients of {list(numels)} values",
                          _zero2_job, (fn, tuple(numels)), problems)


# -- lesson 10: the row-parallel forward ------------------------------------------------------

IN_FEATURES, OUT_FEATURES, ROWS = 12, 5, 3


def row_parallel_inputs(seed: int = 0):
    """x (ROWS, IN_FEATURES), W (OUT_FEATURES, IN_FEATURES), b (OUT_FEATURES): small integers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (ROWS, IN_FEATURES), generator=g).float()
    w = torch.randint(-3, 4, (OUT_FEATURES, IN_FEATURES), generator=g).float()
    b = torch.randint(-3, 4, (OUT_FEATURES,), generator=g).float()
    return x, w, b


def _columns(rank: int, k: int) -> slice:
    n = IN_FEATURES // k
    return slice(rank * n, (rank + 1) * n)


def _row_job(rank, k, fn):
    x, w, b = row_parallel_inputs()
    cols = _columns(rank, k)
    try:
        with Traffic(k) as seen:
            got = fn(x[:, cols].clone(), w[:, cols].clone(), b.clone())
    except NotImplementedError:
        return NOT_WRITTEN
    return _seen(got, seen)


def _row_problem(k, rank, result) -> str | None:
    got, calls = result["got"], result["all_reduce_calls"]
    x, w, b = row_parallel_inputs()
    want = x @ w.T + b
    label = f"world_size {k}: rank {rank}"
    if _close(got, want):
        once = ring_bytes("all_reduce", want.numel() * 4, k)
        if calls == 1 and result["sent"] <= once * 1.001:
            return None
        return (f"{label} got the right output with {calls} dist.all_reduce calls ({result['summary']}: "
                f"{result['sent']:,.0f} bytes sent, where one all_reduce of the output sends {once:,.0f}); a "
                "row-parallel Linear needs exactly one all_reduce")
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return f"{label} returned {_describe(got)}, expected shape {tuple(want.shape)}"
    cols = _columns(rank, k)
    own = x[:, cols] @ w[:, cols].T
    if _close(got, own + b) or _close(got, own):
        return f"{label} returned only its own partial product: the all_reduce that sums the ranks' parts is missing"
    if _close(got, want + (k - 1) * b):
        return (f"{label}'s output holds the bias {k} times: every rank added it before the all_reduce; "
                "add it once, after")
    if _close(got, want - b):
        return f"{label}'s output lacks the bias: add it after the all_reduce"
    if _close(got, (want - b) / k + b) or _close(got, want / k):
        return (f"{label}'s output is the sum of the partial products divided by world_size ({k}): x @ W.T is their "
                "sum, not their average (averaging is for gradients over data-parallel ranks)")
    row, col = (~torch.isclose(got, want)).nonzero()[0].tolist()
    return f"{label} is wrong at [{row}, {col}]: expected {want[row, col].item():g}, got {got[row, col].item():g}"


def check_row_parallel_forward(fn, world_sizes=(2, 3, 4), timeout: float = 30,
                               cluster: Cluster | None = None) -> CheckReport | None:
    """Check ``fn(x_part, weight_part, bias) -> y``: rank r holds columns r of the input features
    (``x[:, part]`` and ``W[:, part]``) and the whole bias; every rank must return ``x @ W.T + b``,
    using one dist.all_reduce."""
    check_callable(fn, "fn(x_part, weight_part, bias)")

    def problems(k, results):
        return (_row_problem(k, rank, r) for rank, r in enumerate(results))

    return check_on_ranks(CheckReport("row-parallel forward"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k}, x {ROWS}x{IN_FEATURES}, W {OUT_FEATURES}x{IN_FEATURES}",
                          _row_job, (fn,), problems)
