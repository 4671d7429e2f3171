"""Exercises that ppkit checks: your function runs on real ranks, for several world sizes.

    check_ring_shift(fn)          lesson 1: pass a tensor to the right neighbour around a ring
    check_ring_all_reduce(fn)     lesson 2: all_reduce built from send/recv only
    check_bucketed_average(fn)    lesson 3: average every gradient with a single all_reduce

Each checker starts its own ranks (``max(world_sizes)`` of them, no process group; or pass
``cluster=`` one started with ``process_group=False``), and for each world size k makes a fresh
process group of ranks 0..k-1 and runs your function there (``ppkit.exercises.subworld``). It returns
a ``CheckReport`` when everything is right and raises ``ExerciseFailed`` otherwise, naming the
world size, tensor size, rank and values that were wrong.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.errors import ExerciseFailed, WorkerDiedError
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import check_on_ranks
from ppkit.lessons import data_parallel

WORLD_SIZES = (2, 3, 4, 5, 6)
TENSOR_SIZES = (1, 7, 1000)
COLLECTIVES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
               "all_to_all", "all_to_all_single", "gather", "scatter")


@contextmanager
def _collectives_forbidden(exercise: str):
    """Make torch.distributed's collectives raise while the learner's function runs."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def forbid(name):
        def refuse(*args, **kwargs):
            raise ExerciseFailed(f"dist.{name} was called, but {exercise} must be built from "
                                 "send/recv (or isend/irecv) only.")
        return refuse

    for name in saved:
        setattr(dist, name, forbid(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _on_ranks(exercise: str, *args):
    """``check_on_ranks``, with a rank that died turned into a finding: here the usual cause is a send or recv to a
    rank outside the world, which crashes gloo (SIGSEGV) rather than raising."""
    try:
        return check_on_ranks(CheckReport(exercise), *args)
    except WorkerDiedError as err:
        raise ExerciseFailed(
            f"{exercise}: {err.args[0] if err.args else err}. The usual cause here: a dist.send/recv (or isend/irecv) "
            "to a rank outside 0..world_size-1, which makes gloo crash the rank instead of raising. Wrap around the "
            "ring with % world_size, e.g. (rank + 1) % world_size", [str(err)]) from None


def _compare(label: str, rank: int, got, want: torch.Tensor, own: torch.Tensor | None = None) -> str | None:
    """None if ``got`` equals ``want``, else one precise sentence."""
    if not isinstance(got, torch.Tensor):
        return f"{label}: rank {rank} returned {type(got).__name__}, not a tensor"
    if got.shape != want.shape:
        return f"{label}: rank {rank} returned shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    wrong = (~torch.isclose(got.double(), want.double(), rtol=1e-5, atol=1e-5)).nonzero().flatten()
    if not len(wrong):
        return None
    i = int(wrong[0])
    text = (f"{label}: rank {rank} is wrong at {len(wrong)} of {want.numel()} position(s); first at "
            f"index {i}: expected {want[i].item():g}, got {got[i].item():g}")
    if own is not None and torch.equal(got, own):
        text += " (the tensor is unchanged: did the function return the tensor it worked on?)"
    elif own is not None and torch.allclose(got.double() + own.double(), want.double()):
        text += " (exactly this rank's own values are missing from the sum)"
    return text


# -- lesson 1: ring shift ---------------------------------------------------------------------

def _ring_input(rank: int, numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.float32) + 100 * rank


def _ring_shift_job(rank, k, fn, sizes):
    out = []
    for numel in sizes:
        got = fn(rank, k, _ring_input(rank, numel))
        out.append(got.detach().clone() if isinstance(got, torch.Tensor) else got)
    return out


def check_ring_shift(fn, world_sizes=WORLD_SIZES, sizes=TENSOR_SIZES, timeout: float = 15,
                     cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(rank, world_size, tensor) -> tensor``: every rank sends ``tensor`` to rank + 1 and
    returns what rank - 1 sent it (the ring wraps around)."""
    check_callable(fn, "fn(rank, world_size, tensor)")

    def problems(k, results):
        for rank in range(k):
            for numel, got in zip(sizes, results[rank]):
                want = _ring_input((rank - 1) % k, numel)
                problem = _compare(f"world_size {k}, {numel} element(s)", rank, got, want,
                                   own=_ring_input(rank, numel))
                if problem and k > 2 and all(_compare("", r, results[r][i], _ring_input((r + 1) % k, n)) is None
                                             for r in range(k) for i, n in enumerate(sizes)):
                    yield (f"world_size {k}, {numel} element(s): rank {rank} holds rank {(rank + 1) % k}'s tensor, "
                           "its right neighbour's: the ring runs the wrong way. Send to (rank + 1) % world_size and "
                           "receive from (rank - 1) % world_size")
                    continue
                yield problem and problem + f" (it should hold rank {(rank - 1) % k}'s tensor)"

    return _on_ranks("ring shift", fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k} x sizes {list(sizes)}", _ring_shift_job, (fn, tuple(sizes)),
                          problems)


# -- lesson 2: ring all_reduce ------------------------------------------------------------------

def _reduce_input(rank: int, numel: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(-50, 50, (numel,), generator=g).float()  # integers: every sum order is exact


def _ring_all_reduce_job(rank, k, fn, sizes):
    out = []
    for seed, numel in enumerate(sizes):
        want = _reduce_input(rank, numel, seed)
        dist.all_reduce(want)  # the reference, before the collectives are switched off
        tensor = _reduce_input(rank, numel, seed)
        with _collectives_forbidden("ring all_reduce"):
            got = fn(rank, k, tensor)
        got = tensor if got is None else got
        out.append((got.detach().clone() if isinstance(got, torch.Tensor) else got, want))
    return out


def check_ring_all_reduce(fn, world_sizes=WORLD_SIZES, sizes=TENSOR_SIZES, timeout: float = 15,
                          cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(rank, world_size, tensor)``: afterwards (returned, or in ``tensor`` if it returns
    None) every rank holds the element-wise sum over all ranks, as ``dist.all_reduce`` gives, using
    only send/recv/isend/irecv."""
    check_callable(fn, "fn(rank, world_size, tensor)")

    def problems(k, results):
        for rank in range(k):
            for seed, (numel, (got, want)) in enumerate(zip(sizes, results[rank])):
                label = f"world_size {k}, {numel} element(s)"
                problem = _compare(label, rank, got, want, own=_reduce_input(rank, numel, seed))
                yield problem and (problem + _all_reduce_hint(got, want, k, rank))

    return _on_ranks("ring all_reduce", fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k} x sizes {list(sizes)}", _ring_all_reduce_job,
                          (fn, tuple(sizes)), problems)


def _all_reduce_hint(got, want: torch.Tensor, k: int, rank: int) -> str:
    """A named mistake behind a wrong ring all_reduce: an average for the sum, or the all-gather half missing."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return ""
    if torch.allclose(got.double() * k, want.double()):
        return (f" (it is the sum divided by world_size, {k}: all_reduce's SUM leaves the sum; averaging is a "
                "separate step, the caller's)")
    chunks = list(zip(got.double().tensor_split(k), want.double().tensor_split(k)))
    right = [i for i, (g, w) in enumerate(chunks) if len(w) and torch.equal(g, w)]
    if len(want) >= k and right == [(rank + 1) % k]:
        return (f" (only chunk {right[0]} holds the sum: that is where the reduce-scatter leaves rank {rank}; the "
                "all-gather half, world_size - 1 more steps passing the finished chunks on, is missing)")
    return ""


# -- lesson 3: one all_reduce for all gradients -------------------------------------------------

def _bucket_job(rank, k, fn, batch_size):
    model = data_parallel.local_backward(rank, k, batch_size)
    local = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    calls = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        fn(model)
    finally:
        dist.all_reduce = real
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    return {"grads": grads, "all_reduce_calls": calls, "local": local}


def check_bucketed_average(fn, world_sizes=(2, 3, 4), batch_size: int = 24, timeout: float = 30,
                           cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(model)``: after it, every gradient equals the whole batch's gradient (the average
    of the ranks' gradients), and it used exactly one ``dist.all_reduce`` for all of them."""
    check_callable(fn, "fn(model)")
    want = data_parallel.whole_batch_gradients(batch_size)

    def problems(k, results):
        for rank, result in enumerate(results):
            calls = result["all_reduce_calls"]
            if len(calls) != 1:
                yield (f"world_size {k}: rank {rank} called dist.all_reduce {len(calls)} times (on "
                       f"{calls} elements); the exercise asks for one call on one flat tensor that "
                       "holds every gradient (torch.cat of the flattened grads)")
            for name, g in result["grads"].items():
                if torch.allclose(g, want[name], rtol=1e-4, atol=1e-6):
                    continue
                diff = float((g - want[name]).abs().max())
                text = (f"world_size {k}: rank {rank}, gradient of {name!r} differs from the "
                        f"whole-batch gradient by up to {diff:.3g}")
                if torch.allclose(g, want[name] * k, rtol=1e-4, atol=1e-6):
                    text += f" (it is {k} times too large: summed but not divided by world_size)"
                elif torch.equal(g, result["local"][name]):
                    text += (" (it is this rank's own gradient, unchanged: the averaged flat tensor was never copied "
                             "back into p.grad)")
                yield text

    return check_on_ranks(CheckReport("bucketed gradient averaging"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k}, batch {batch_size}", _bucket_job, (fn, batch_size), problems)
