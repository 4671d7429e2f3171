"""Exercises that ppkit checks: your function runs on real ranks, for several world sizes.

    check_ring_shift(fn)          lesson 1: pass a tensor to the right neighbour around a ring
    check_ring_all_reduce(fn)     lesson 2: all_reduce built from send/recv only
    check_bucketed_average(fn)    lesson 3: average every gradient with a single all_reduce

Each checker starts its own ranks (``max(world_sizes)`` of them, no process group; or pass
``cluster=`` one started with ``process_group=False``), and for each world size k makes a fresh
process group of ranks 0..k-1 and runs your function there. It returns
a ``CheckReport`` when everything is right and raises ``ExerciseFailed`` otherwise, naming the
world size, tensor size, rank and values that were wrong.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.errors import ConfigError, ExerciseFailed, JobTimeoutError, RemoteError
from ppkit.lessons import data_parallel
from ppkit.lessons.p2p import blocked_call

WORLD_SIZES = (2, 3, 4, 5, 6)
TENSOR_SIZES = (1, 7, 1000)
MAX_REPORTED = 8  # failures listed in the message; all of them stay in .failures
COLLECTIVES = ("all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
               "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
               "all_to_all", "all_to_all_single", "gather", "scatter")


@dataclass
class CheckReport:
    """What a checker ran. ``failures`` is empty when it passed."""

    exercise: str
    cases: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        if self.passed:
            return f"{self.exercise}: passed all {len(self.cases)} cases ({'; '.join(self.cases)})."
        shown = self.failures[:MAX_REPORTED]
        more = len(self.failures) - len(shown)
        return (f"{self.exercise}: {len(self.failures)} problem(s) in {len(self.cases)} cases:\n  - "
                + "\n  - ".join(shown) + (f"\n  ... and {more} more (see .failures)" if more else ""))


# -- running a function in a sub-world of k ranks ---------------------------------------------

_store_ids = itertools.count()


def _in_subworld(rank, size, k, store_path, job, args):
    """Ranks < k join a fresh k-rank process group and run ``job``; the others sit this one out."""
    if rank >= k:
        return None
    store = dist.FileStore(store_path, k)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=k, timeout=timedelta(seconds=600))
    try:
        return job(rank, k, *args)
    finally:
        dist.destroy_process_group()


class _Runner:
    def __init__(self, world_sizes, timeout: float, cluster: Cluster | None = None):
        self.timeout = timeout
        need = max(world_sizes)
        if cluster is not None and (cluster.process_group or cluster.world_size < need
                                    or cluster.state == "closed"):
            raise ConfigError(
                f"the checker needs an open cluster of at least {need} ranks started without a process "
                f"group, e.g. ppkit.Cluster({need}, 'gloo', process_group=False); got {cluster!r}. "
                "Or pass no cluster and the checker starts its own.")
        self._own = cluster is None
        self.cluster = cluster or Cluster(need, "gloo", process_group=False, timeout=timeout)
        self._tmp = Path(tempfile.mkdtemp(prefix="ppkit-exercise-"))

    def close(self) -> None:
        if self._own:
            self.cluster.close()
        elif self.cluster.state == "broken":
            self.cluster.restart()  # hand the caller's cluster back usable
        shutil.rmtree(self._tmp, ignore_errors=True)

    def run(self, k: int, job, *args):
        """``(results of ranks 0..k-1, None)``, or ``(None, what went wrong)``."""
        store = str(self._tmp / f"store-{next(_store_ids)}")
        if self.cluster.state == "broken":
            self.cluster.restart()
        try:
            results = self.cluster.run(_in_subworld, k, store, job, args, timeout=self.timeout)
        except JobTimeoutError as err:
            return None, _explain_hang(err, k, self.timeout)
        except RemoteError as err:
            return None, _explain_raise(err)
        return results[:k], None


def _explain_hang(err: JobTimeoutError, k: int, timeout: float) -> str:
    calls = {r: blocked_call(r, text) for r, text in err.stacks.items() if r < k}
    where = "; ".join(str(c) for c in calls.values() if c) or "no stack available"
    text = f"did not finish within {timeout:g} s ({where})"
    if calls and all(c and c.torch_call == "dist.send" for c in calls.values()):
        text += (". Every rank is in dist.send and none has posted its recv: with gloo a send waits "
                 "until the matching recv is posted, so everyone sending first deadlocks. Let even "
                 "ranks send first and odd ranks receive first, or use dist.isend/dist.irecv")
    return text


_KNOCK_ON = ("RuntimeError", "DistBackendError", "DistNetworkError")  # what gloo raises when a peer left


def _explain_raise(err: RemoteError) -> str:
    """The first rank's own exception, not the connection errors it caused on the others."""
    causes = [r for r in err.ranks if err.exc_types.get(r) not in _KNOCK_ON] or err.ranks
    def last_line(r):
        return err.tracebacks[r].strip().splitlines()[-1].removeprefix("ppkit.errors.")

    rank = causes[0]
    same = [r for r in err.ranks if r != rank and last_line(r) == last_line(rank)]
    other = [r for r in err.ranks if r != rank and r not in same]
    also = (f" (rank(s) {same} raised the same)" if same else "") + (
        f" (rank(s) {other} failed too)" if other else "")
    return f"rank {rank} raised {last_line(rank)}{also}"


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


def _raise_or_report(report: CheckReport) -> CheckReport:
    if report.failures:
        raise ExerciseFailed(str(report), report.failures)
    print(report)
    return report


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
    report = CheckReport("ring shift")
    runner = _Runner(world_sizes, timeout, cluster)
    try:
        for k in world_sizes:
            report.cases.append(f"world_size {k} x sizes {list(sizes)}")
            results, problem = runner.run(k, _ring_shift_job, fn, tuple(sizes))
            if problem:
                report.failures.append(f"world_size {k}: {problem}")
                continue
            for rank in range(k):
                for numel, got in zip(sizes, results[rank]):
                    want = _ring_input((rank - 1) % k, numel)
                    label = f"world_size {k}, {numel} element(s)"
                    problem = _compare(label, rank, got, want, own=_ring_input(rank, numel))
                    if problem:
                        report.failures.append(problem + f" (it should hold rank {(rank - 1) % k}'s tensor)")
    finally:
        runner.close()
    return _raise_or_report(report)


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
    report = CheckReport("ring all_reduce")
    runner = _Runner(world_sizes, timeout, cluster)
    try:
        for k in world_sizes:
            report.cases.append(f"world_size {k} x sizes {list(sizes)}")
            results, problem = runner.run(k, _ring_all_reduce_job, fn, tuple(sizes))
            if problem:
                report.failures.append(f"world_size {k}: {problem}")
                continue
            for rank in range(k):
                for seed, (numel, (got, want)) in enumerate(zip(sizes, results[rank])):
                    problem = _compare(f"world_size {k}, {numel} element(s)", rank, got, want,
                                       own=_reduce_input(rank, numel, seed))
                    if problem:
                        report.failures.append(problem)
    finally:
        runner.close()
    return _raise_or_report(report)


# -- lesson 3: one all_reduce for all gradients -------------------------------------------------

def _bucket_job(rank, k, fn, batch_size):
    model = data_parallel.local_backward(rank, k, batch_size)
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
    return {"grads": grads, "all_reduce_calls": calls}


def check_bucketed_average(fn, world_sizes=(2, 3, 4), batch_size: int = 24, timeout: float = 30,
                           cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(model)``: after it, every gradient equals the whole batch's gradient (the average
    of the ranks' gradients), and it used exactly one ``dist.all_reduce`` for all of them."""
    check_callable(fn, "fn(model)")
    want = data_parallel.whole_batch_gradients(batch_size)
    report = CheckReport("bucketed gradient averaging")
    runner = _Runner(world_sizes, timeout, cluster)
    try:
        for k in world_sizes:
            report.cases.append(f"world_size {k}, batch {batch_size}")
            results, problem = runner.run(k, _bucket_job, fn, batch_size)
            if problem:
                report.failures.append(f"world_size {k}: {problem}")
                continue
            for rank, result in enumerate(results):
                calls = result["all_reduce_calls"]
                if len(calls) != 1:
                    report.failures.append(
                        f"world_size {k}: rank {rank} called dist.all_reduce {len(calls)} times (on "
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
                    report.failures.append(text)
    finally:
        runner.close()
    return _raise_or_report(report)
