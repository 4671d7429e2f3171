"""Running a learner's function on ranks 0..k-1 of a cluster, in a fresh k-rank process group.

One cluster (no process group of its own) serves every world size a checker tries. When the
function hangs or raises, the answer is one sentence about the cause: where each rank waits, or
the first rank's own exception rather than the connection errors it caused on the others.

A case's group is made whatever the case before it did: no rank starts the learner's function before
every rank has joined (a rank done early would close its gloo connections while another still makes its
own: "connectFullMesh failed ... Connection closed by peer"), and a group that could not be made is made
again on restarted ranks (a rank whose ``init_process_group`` failed keeps torch's count of groups one
ahead, so it would wait for ever in the next group it joins).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from ppkit.cluster.controller import Cluster
from ppkit.errors import ConfigError, JobTimeoutError, RemoteError, WorkerDiedError
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.lessons.p2p import blocked_call

_store_ids = itertools.count()
NOT_WRITTEN = {"not_written": True}  # what a rank's job returns while the learner's function is the stub
JOIN_TRIES = 3  # a case's group is tried this often, on restarted ranks, before the check says it could not


class GroupNotMade(RuntimeError):
    """A rank could not join a case's process group: nothing to do with the learner's function."""


def check_on_ranks(report: CheckReport, fn, world_sizes, timeout: float, cluster: Cluster | None,
                   cases, job, args: tuple, problems, detail: bool = False) -> CheckReport | None:
    """What every checker that runs ``fn`` on ranks does: for each world size k, note ``cases(k)`` (one
    case or a list), run ``job(rank, k, *args)`` in a fresh group of ranks 0..k-1, and report what
    ``problems(k, results)`` yields (a sentence, or None for a right result). Returns the report, or
    raises ``ExerciseFailed``; None when a rank's job returned ``NOT_WRITTEN``. ``detail``: the groups
    check every collective as ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does (a mismatch raises, not hangs)."""
    runner = SubworldRunner(world_sizes, timeout, cluster, detail)
    try:
        for k in world_sizes:
            named = cases(k)
            report.case(*([named] if isinstance(named, str) else named))
            results, problem = runner.run(k, job, *args)
            if problem:
                report.fail(f"world_size {k}: {problem}")
                continue
            if any(r == NOT_WRITTEN for r in results):
                print(f"not written yet: replace the NotImplementedError in {getattr(fn, '__name__', fn)}")
                return None
            report.fail(*(text for text in problems(k, results) if text))
    finally:
        runner.close()
    return raise_or_report(report)


def _in_subworld(rank, size, k, store_path, job, args, detail=False):
    """Ranks < k join a fresh k-rank process group and run ``job``; the others sit this one out."""
    if rank >= k:
        return None
    level = dist.get_debug_level()
    if detail:  # read when the group is made: it then checks each collective's fingerprint on every rank
        dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        _join_case_group(rank, k, store_path)
        _joined_mark(store_path, rank).touch()  # a rank that dies after this died in the learner's function
        try:
            return job(rank, k, *args)
        finally:
            dist.destroy_process_group()
    finally:
        dist.set_debug_level(level)


def _join_case_group(rank: int, k: int, store_path: str) -> None:
    """Join the case's fresh k-rank group, and wait until every rank of it has (a barrier): only then may
    one rank's job end and close its connections. ``GroupNotMade`` if this rank could not."""
    try:
        dist.init_process_group("gloo", store=dist.FileStore(store_path, k), rank=rank, world_size=k,
                                timeout=timedelta(seconds=600))
        dist.barrier()
    except Exception as exc:
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # its error would hide why the group was not made
                dist.destroy_process_group()
        raise GroupNotMade(f"rank {rank} could not join the case's {k}-rank process group: {exc}") from exc


class SubworldRunner:
    """Runs jobs in sub-worlds of ``cluster`` (or of one it starts for ``max(world_sizes)`` ranks)."""

    def __init__(self, world_sizes, timeout: float, cluster: Cluster | None = None, detail: bool = False):
        self.timeout, self.detail = timeout, detail
        need = max(world_sizes)
        if cluster is not None and (cluster.process_group or cluster.world_size < need
                                    or cluster.state == "closed"):
            raise ConfigError(
                f"the checker needs an open cluster of at least {need} ranks started without a process "
                f"group, e.g. ppkit.Cluster({need}, 'gloo', process_group=False); got {cluster!r}. "
                "Or pass no cluster and the checker starts its own.")
        self._own = cluster is None
        self.cluster = cluster or Cluster(need, "gloo", process_group=False, timeout=timeout)
        self._tmp = stores_folder()

    def close(self) -> None:
        if self._own:
            self.cluster.close()
        elif self.cluster.state == "broken":
            self.cluster.restart()  # hand the caller's cluster back usable
        shutil.rmtree(self._tmp, ignore_errors=True)

    def run(self, k: int, job, *args):
        """``(results of ranks 0..k-1, None)``, or ``(None, what went wrong)``. A group that could not be
        made (a rank failed, stalled or died joining it) is made again on restarted ranks, ``JOIN_TRIES``
        times, with a line that says so before each new try."""
        for attempt in range(1, JOIN_TRIES + 1):
            store = str(self._tmp / f"store-{next(_store_ids)}")
            if self.cluster.state == "broken":
                self.cluster.restart()
            try:
                results = self.cluster.run(_in_subworld, k, store, job, args, self.detail, timeout=self.timeout)
            except JobTimeoutError as err:
                if not _stalled_joining(err, k):
                    return None, _explain_hang(err, k, self.timeout)
                why = f"it did not finish joining within {self.timeout:g} s"
            except RemoteError as err:
                failed = [r for r in err.ranks if err.exc_types.get(r) == GroupNotMade.__name__]
                if not failed:
                    return None, _explain_raise(err)
                why = err.messages.get(failed[0], "")
            except WorkerDiedError as err:
                if all(_joined_mark(store, r).exists() for r in err.ranks if r < k):
                    raise  # it died in the learner's function, or sitting the case out
                why = str(err)
            else:
                return results[:k], None
            if attempt < JOIN_TRIES:
                print(f"[ppkit] the case's group could not be made ({why}): restarting the ranks, "
                      f"try {attempt + 1} of {JOIN_TRIES}")
            self.cluster.restart()  # fresh processes: no torch state left from the group that failed
        return None, (f"the case's {k}-rank process group could not be made in {JOIN_TRIES} tries (last: {why}). "
                      "This is not about your function: run the check again, or restart the kernel")


def stores_folder() -> Path:
    """A new folder for the cases' FileStores (a test points it at a place no rank can write)."""
    return Path(tempfile.mkdtemp(prefix="ppkit-exercise-"))


def _joined_mark(store_path: str, rank: int) -> Path:
    return Path(f"{store_path}.joined-{rank}")


def _stalled_joining(err: JobTimeoutError, k: int) -> bool:
    """Whether a rank of the case was still joining its group when the job timed out."""
    return any(_join_case_group.__name__ in text for r, text in err.stacks.items() if r < k)


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
