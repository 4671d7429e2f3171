"""One call of ppkit.spawn or %%torchrun: ``fn(i, *args)`` on each fresh process, each process ending
with it as a script does (transport/interpreter_exit.py), and what is left stopped when the call ends.

The first rank that raises stays, in IPython, for ``%debug`` (parked.py); the others are stopped.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

from ppkit.checks import positive
from ppkit.cluster import hang_watch
from ppkit.cluster.controller import Cluster
from ppkit.cluster.debug import parked
from ppkit.cluster.faults import arming as faults
from ppkit.cluster.hang_doctor import on_demand, outcomes
from ppkit.cluster.hang_watch import HangWatch
from ppkit.cluster.rpc import pickler as rpc_pickle
from ppkit.cluster.spawn import explain
from ppkit.errors import ClusterStateError, ConfigError, JobInterrupted, RemoteError, WorkerError


class Call:
    """One call: ``fn(i, *args)`` on each fresh process, then what is left stopped."""

    def __init__(self, cluster: Cluster, fn, args: tuple, timeout: float | None, environ: dict,
                 caller: explain.Caller = explain.SPAWN):
        self.cluster, self.fn, self.args, self.timeout, self.caller = cluster, fn, args, timeout, caller
        self.park = True  # its processes are this machine's: the one that raised may stay for %debug
        self.profile = None  # a profiling.collect.Request: every rank runs under torch.profiler
        self.shown = (fn, args)  # the learner's function and arguments, named when one cannot be pickled
        self.pids = {rank: worker.get("pid") for rank, worker in cluster.workers.items()}
        changed = {k: v for k, v in os.environ.items() if environ.get(k) != v}
        self.environ = (changed, [k for k in environ if k not in os.environ])

    def run(self):
        """None, or with ``profile`` set the run's ``ppkit.Profile`` (ppkit/profiling/)."""
        __tracebackhide__ = True  # noqa: F841 - IPython then shows the rank's error, not this frame that raised it
        from ppkit.progress import hooks as progress  # the learner's record (ppkit/progress/), lazily: a layer above

        kept, failed, offsets = (), False, None
        progress.job_started(self.caller.name, self.cluster.world_size)
        try:
            offsets = _clock_offsets(self.cluster) if self.profile else None
            watch = HangWatch(hang_watch.threshold(), explain.shown_stacks)  # also before a timeout ends it
            values = self.cluster.run_to_exit(_call_rank, (self.fn, self.args, self.environ, self.profile),
                                              self.timeout, watch)
            return _profile(values, offsets) if self.profile else None
        except ConfigError as exc:  # run() checked the rest: fn or args cannot be pickled
            raise explain.cannot_send(*self.shown, exc, self.caller) from None
        except (WorkerError, JobInterrupted) as exc:
            failed = True
            kept = _to_keep(exc) if self.park and parked.can_park() else ()
            caller = replace(self.caller, kept=kept[0]) if kept else self.caller
            error = explain.translate(exc, self.pids, self.cluster.world_size, self.timeout, caller)
            faults.explain(error)  # a rank failed on purpose (ppkit.fail_rank): the error says so
            on_demand.remember(getattr(error, "diagnosis", None), self.caller.name)  # ppkit.collective_doctor()
            if kept:
                parked.park(self.cluster, kept).error = error
            if self.profile:
                _keep_recorded(error, exc, self.cluster.world_size, offsets)
            raise error from None
        finally:
            ended = sys.exc_info()[1]
            progress.job_ended(self.caller.name, self.cluster.world_size, ended)  # its error, or None
            if ended is None:  # collective_doctor() then says so, not what an earlier failed run's doctor read
                on_demand.succeeded(self.caller.name, self.cluster.last_job_diagnosis)
                faults.unfired(self.caller.name)  # a fault armed for this run that did not fire is dropped
            elif not failed:  # interrupted or refused before its ranks ran to an end
                on_demand.remember(None, self.caller.name)
            cut_short = False
            try:
                self._stop(failed, kept)
            except KeyboardInterrupt:  # a stop is idempotent: finish what the interrupt cut short
                self._stop(failed, kept)
                cut_short = ended is None
            if cut_short:  # outside the handler: the cell shows this, not the KeyboardInterrupt and ppkit's frames
                raise JobInterrupted(
                    f"interrupted while {self.caller.name} stopped its {self.caller.units}, after {self.caller.work} "
                    f"had returned on every one of them: the run ended without error, and every "
                    f"{self.caller.unit} has been stopped. The next {self.caller.name} starts fresh ones.")

    def _stop(self, failed: bool, kept: tuple[int, ...]) -> None:
        if failed:  # as torchrun's agent stops them: SIGTERM, then SIGKILL; one that raised may stay (parked.py)
            self.cluster.stop_workers_but(kept, f"{self.caller.name} kept rank {kept[0]} for %debug." if kept
                                          else f"{self.caller.name} stopped its processes after a failure.")
        if not kept:
            self.cluster.stop_workers(f"{self.caller.name} stops its processes when a call ends.")


def _to_keep(exc: BaseException) -> tuple[int, ...]:
    """The first rank that raised an exception (not sys.exit), to keep for a post-mortem."""
    if not isinstance(exc, RemoteError):
        return ()
    raised = [rank for rank in exc.ranks if exc.exc_types.get(rank) != "SystemExit"]
    return tuple(raised[:1])


def _clock_offsets(cluster: Cluster) -> dict:
    from ppkit.profiling import clocks

    return clocks.measure(cluster.run)


def _profile(values: list, offsets: dict):
    from ppkit.profiling.profile import Profile

    return Profile.from_results(values, offsets)


def _keep_recorded(error: BaseException, exc: BaseException, world_size: int, offsets) -> None:
    """A profiled call that failed: the traces of the ranks that returned, as ``error.profile``, with why each
    other rank's is missing (a rank that raises sends its error, not its trace)."""
    sent = getattr(exc, "values", {})
    raised = getattr(exc, "exc_types", {})
    first = min(raised, default=None)
    missing = {rank: (f"it raised {raised[rank]}, and a rank that raises sends its error, not its trace"
                      if rank in raised else
                      f"it was stopped after rank {first} failed" if first is not None else
                      f"the call ended with {type(exc).__name__} before it sent its trace")
               for rank in range(world_size) if not isinstance(sent.get(rank), dict)}
    from ppkit.profiling.profile import Profile

    error.profile = Profile.from_results([sent.get(rank) for rank in range(world_size)], offsets, missing)
    error.add_note(f"The traces of ranks {sorted(error.profile.ranks)} are on this error's .profile; "
                   + "; ".join(f"rank {rank} has none: {why}" for rank, why in missing.items()) + ".")

def _call_rank(rank: int, world_size: int, fn, args: tuple, environ: tuple, profile=None):
    """What each process runs: mp.spawn's ``fn(i, *args)``, in the kernel's environment as it is
    now (mp.spawn's processes inherit it), its return value dropped as mp.spawn drops it. With
    ``profile`` (a Request) it runs under torch.profiler, and the rank's trace is what it returns."""
    if profile is not None:
        from ppkit.profiling import collect

        return collect.profiled(lambda: _call_rank(rank, world_size, fn, args, environ), profile)
    changed, removed = environ
    os.environ.update(changed)
    for name in removed:
        os.environ.pop(name, None)
    try:  # RPC sends a cell's functions and classes by value, as ppkit's RPC world does
        rpc_pickle.install()
    except (ImportError, ClusterStateError):  # a torch without RPC (Windows) or without its internals
        pass
    try:
        fn(rank, *args)
    except SystemExit as exc:  # sys.exit(0) ends a process of mp.spawn successfully
        if exc.code not in (None, 0):
            raise
        return outcomes.SYS_EXIT  # the doctor then says so, not "it finished its job"
    return None


def time_limit(timeout) -> float | None:
    """None (no limit, as mp.spawn and torchrun have none) or a positive number of seconds."""
    return None if timeout is None else positive(timeout, "timeout", "None (no limit) or a positive number of seconds")
