"""``ppkit.fail_rank`` in the kernel: a kill now, of a rank of the run going on, or a fault armed for the
next run, which every job carries (job_running.py wraps its function in ``on_rank.with_fault``) until one
fails. A ``ppkit.spawn`` or ``%%torchrun`` call whose run ends without the fault firing says so, and the
fault is dropped; on a ``Cluster`` it stays armed for the next ``cluster.run`` until it fires or is cancelled.
"""

from __future__ import annotations

import functools
import os
import socket
import threading

from ppkit.cluster.faults import on_rank
from ppkit.cluster.faults.plan import Fault, fault, sent_now
from ppkit.errors import ConfigError

_lock = threading.Lock()
_armed: list[Fault] = []  # at most one: the fault the next run carries
_runs: list[dict] = []  # the workers of each run going on now (rank -> info), the latest last
_last: list[Fault] = []  # the fault that ended the last failed run, to name in its error


class Armed:
    """What ``ppkit.fail_rank`` returns: the fault, and ``cancel()`` to take it back before it fires."""

    def __init__(self, planned: Fault, fired: bool):
        self.fault, self.fired = planned, fired

    def cancel(self) -> bool:
        """Disarm it; False if it had already fired or been dropped."""
        with _lock:
            if self.fault in _armed:
                _armed.remove(self.fault)
                return True
        return False

    @property
    def armed(self) -> bool:
        return self.fault in _armed

    def __repr__(self) -> str:
        state = "fired" if self.fired else "armed" if self.armed else "no longer armed"
        return f"<{self.fault.describe()}: {state}>"


def fail_rank(rank: int, how: str = "kill", *, signal=None, at_step: int | None = None,
              after: float | None = None) -> Armed:
    """Fail ``rank`` on purpose: kill it with ``signal`` (SIGKILL by default), or make it raise or hang.

    >>> ppkit.fail_rank(1, how="raise", at_step=3)   # then run: rank 1 raises at ppkit.step(3)
    >>> ppkit.spawn(train, args=(2,), nprocs=2)      # ProcessRaisedError: rank 1 failed at step 3, on purpose

    While a run goes on (called from a widget's callback or a thread), ``fail_rank(1)`` and
    ``fail_rank(1, signal="SIGTERM")`` kill that rank now, with no change to its code. Otherwise the fault
    is armed for the next run of ``cluster.run``, ``ppkit.spawn`` or ``%%torchrun``: with ``at_step=N`` the
    rank fails once its loop calls ``ppkit.step(i)`` with ``i >= N``; with ``after=S`` (kill only) S seconds
    into the run; with neither, as the run starts. ``--max-restarts`` runs it on the first attempt only.
    Returns an ``Armed`` (``.cancel()``). docs/faults.md.
    """
    planned = fault(rank, how, signal, at_step, after)
    if how == "kill" and at_step is None and after is None:
        with _lock:
            workers = _runs[-1] if _runs else None
        if workers is not None:
            planned = sent_now(planned)
            _kill_now(planned, workers)
            return Armed(planned, fired=True)
    with _lock:
        _armed[:] = [planned]
    return Armed(planned, fired=False)


def _kill_now(planned: Fault, workers: dict) -> None:
    info = workers.get(planned.rank)
    if info is None:
        raise ConfigError(f"{planned.describe()}: the run going on has ranks 0 to {len(workers) - 1}, so there is "
                          f"no rank {planned.rank} to kill. Name one of them.")
    host = info.get("host")
    if host not in (None, socket.gethostname()):
        raise ConfigError(f"{planned.describe()}: rank {planned.rank} runs on {host}, not on this machine, and the "
                          "kernel can signal only its own machine's processes. Arm it before the run with at_step= "
                          "or after=, so that the rank fails itself.")
    with _lock:
        _last[:] = [planned]
    try:
        os.kill(info["pid"], planned.signal)
    except ProcessLookupError:
        pass  # it ended meanwhile: the run says how


def carried(fn, world_size: int):
    """``fn`` as a job of a run with the armed fault, if one is armed (``fn`` itself otherwise)."""
    with _lock:
        planned = _armed[0] if _armed else None
    if planned is None:
        return fn
    if planned.rank >= world_size:
        with _lock:
            _armed.clear()
        raise ConfigError(f"{planned.describe()} names rank {planned.rank}, and this run has ranks 0 to "
                          f"{world_size - 1}: nothing ran, and the fault is dropped. Arm it again with one of them.")
    return functools.partial(on_rank.with_fault, planned, fn)


class running:
    """``with running(workers, fn_carried):`` a run going on, whose ranks ``fail_rank`` can kill now; a run
    that fails drops the armed fault it carried (it fired, or the run ended first: either way it is used)."""

    def __init__(self, workers: dict, job):
        self.workers, self.job = workers, job

    def __enter__(self):
        with _lock:
            _runs.append(self.workers)
        return self

    def __exit__(self, exc_type, exc, tb):
        with _lock:
            _runs.remove(self.workers)
            ours = isinstance(self.job, functools.partial) and self.job.func is on_rank.with_fault
            planned = self.job.args[0] if ours else None
            if exc is not None and planned is not None:
                _last[:] = [planned]
                if planned in _armed:
                    _armed.remove(planned)
        return False


def explain(error: BaseException) -> None:
    """A run's error, with a note naming the fault that caused it, if one did (said once)."""
    with _lock:
        planned = _last[0] if _last else None
    if planned is not None and planned.rank in (getattr(error, "ranks", None) or []):
        note = (f"rank {planned.rank} failed on purpose: {planned.describe()}, {planned.when()}. "
                "The other ranks ended as they would after a real failure.")
        if note not in getattr(error, "__notes__", []):
            error.add_note(note)


def unfired(name: str) -> None:
    """A ppkit.spawn or %%torchrun call ended without error: an armed fault did not fire, and is dropped."""
    with _lock:
        planned = _armed.pop() if _armed else None
    if planned is not None:
        why = (f"rank {planned.rank}'s loop never called ppkit.step(i) with i >= {planned.at_step}"
               if planned.at_step is not None else f"the run ended before {planned.after:g} s"
               if planned.after is not None else "its signal was handled")
        print(f"[ppkit] {planned.describe()} did not fire: {name}'s run ended first ({why}). It is dropped; arm "
              "it again before the next run.", flush=True)


def forget() -> None:
    """A new run: the last run's fault no longer explains anything."""
    with _lock:
        _last.clear()
