"""ppkit's own exceptions, so a notebook can catch ``ppkit.WorkerError`` instead of parsing text.

    PPKitError
    ├── ConfigError          bad arguments, caught before anything starts (also a ValueError)
    ├── LaunchError          workers did not start or join
    ├── AuthenticationError  a client with the wrong key tried to join
    ├── ClusterStateError    the cluster is closed, or broken and needs ``restart()``
    ├── RpcPickleError       an RPC's function, argument or result cannot be pickled (also a TypeError)
    └── WorkerError          something went wrong on a rank during a job
        ├── RemoteError      the job raised on one or more ranks (remote traceback attached)
        │   └── ProcessRaisedError   ... in a process of ppkit.spawn (mp's ProcessRaisedException)
        ├── WorkerDiedError  a rank's process died
        │   └── ProcessExitedError   a process of ppkit.spawn exited (mp's ProcessExitedException)
        ├── JobTimeoutError  the job did not finish in time (stack of every waiting rank attached)
        └── DebuggerQuit     a pdb session on a rank ended the job (the learner quit, or no stdin)

``JobInterrupted`` is a ``KeyboardInterrupt`` (so Ctrl-C in a script still stops it), raised when
Kernel > Interrupt cancels a job.
"""

from __future__ import annotations


class PPKitError(Exception):
    """Base class of every error ppkit raises on purpose."""


def _learners_traceback(error: BaseException) -> list[str]:
    """IPython's traceback of ``error`` without ppkit's own frames (IPython hides a frame that sets
    ``__tracebackhide__``, but never the one that raised): a rank's error shows once, under the learner's line."""
    import os
    import types

    from IPython import get_ipython

    shell = get_ipython()
    own = os.path.dirname(os.path.abspath(__file__)) + os.sep
    kept, tb = [], error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        ipython_runs_the_cell = code.co_name == "run_code" and f"IPython{os.sep}core" in code.co_filename
        if not code.co_filename.startswith(own) and not ipython_runs_the_cell:
            kept.append(tb)
        tb = tb.tb_next
    shown = None  # a new chain: the error's own traceback stays whole (for %debug in the kernel)
    for tb in reversed(kept):
        shown = types.TracebackType(shown, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
    return shell.InteractiveTB.structured_traceback(type(error), error, shown, tb_offset=0)


class _ShownWithoutOwnFrames:
    """In IPython, the error's traceback leaves ppkit's frames out (``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        try:
            return _learners_traceback(self)
        except Exception:  # noqa: BLE001 - no IPython, or an IPython without InteractiveTB: the usual traceback
            import traceback

            return traceback.format_exception(type(self), self, self.__traceback__)


class ConfigError(PPKitError, ValueError):
    """An argument is invalid; nothing was started."""


class LaunchError(PPKitError):
    """Workers could not be started, or did not join in time."""


class AuthenticationError(PPKitError):
    """A client presented the wrong key to a ppkit control channel."""


class ClusterStateError(PPKitError):
    """The cluster cannot run jobs now: it is closed, or broken and must be restarted."""


class _WithRecords:
    """``diagnosis``: the collective doctor's reading of the ranks' flight records as the job ended (None if
    it did not look); ``flight_records``: those records, rank -> record; ``diagnosis.write_dumps(folder)``
    writes them as torch's dump files, which ``python -m torch.distributed.flight_recorder.fr_trace`` reads."""

    diagnosis = None

    @property
    def flight_records(self) -> dict[int, dict]:
        return dict(self.diagnosis.records) if self.diagnosis is not None else {}


class WorkerError(_WithRecords, _ShownWithoutOwnFrames, PPKitError):
    """A job failed on one or more ranks. ``ranks`` lists them; ``diagnosis`` and ``flight_records``: what
    the collective doctor read as it ended."""

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = list(ranks or [])


class RemoteError(WorkerError):
    """The job raised an exception on one or more ranks.

    ``tracebacks`` maps rank -> the remote traceback text; ``exc_types`` maps rank -> the
    exception's class name on that rank, ``messages`` to its message. ``stacks`` maps each rank
    that was still waiting -> where it waited; ``rendezvous`` maps rank -> the (scheme, host, port)
    of each env:// or tcp:// rendezvous its process made (a repeated port explains many hangs).
    ``values`` maps each rank that returned -> what it returned (a profiled run's trace).
    """

    def __init__(self, message, ranks, tracebacks, exc_types, messages=None, stacks=None, rendezvous=None):
        super().__init__(message, ranks)
        self.values: dict = {}
        self.tracebacks = dict(tracebacks)
        self.exc_types = dict(exc_types)
        self.messages = dict(messages or {})
        self.stacks = dict(stacks or {})
        self.rendezvous = dict(rendezvous or {})


class WorkerDiedError(WorkerError):
    """A rank's process exited or was killed; ``status``: its wait status, where known; ``how``: that in
    words ("it was killed by signal SIGKILL; it ran OUT OF MEMORY: ..."), where known."""

    def __init__(self, message: str, ranks: list[int] | None = None, status: int | None = None, how: str = ""):
        super().__init__(message, ranks)
        self.status = status
        self.how = how


class JobTimeoutError(WorkerError, TimeoutError):
    """The job did not finish in time. ``stacks`` maps each waiting rank -> where it waits;
    ``done`` lists the ranks that finished, ``rendezvous`` is as in ``RemoteError``."""

    def __init__(self, message, ranks, stacks, done=None, rendezvous=None):
        super().__init__(message, ranks)
        self.stacks = dict(stacks)
        self.done = list(done or [])
        self.rendezvous = dict(rendezvous or {})


class JobInterrupted(_WithRecords, _ShownWithoutOwnFrames, KeyboardInterrupt):
    """Kernel > Interrupt (or Ctrl-C) cancelled a running job. ``ranks``: those that could not
    be stopped, ``stacks``: where each of them waits; ``diagnosis`` and ``flight_records`` as in WorkerError."""

    def __init__(self, message: str = "", ranks: list[int] | None = None, stacks: dict | None = None):
        super().__init__(message)
        self.ranks = list(ranks or [])
        self.stacks = dict(stacks or {})


# --- the lessons ---------------------------------------------------------

class ExerciseFailed(PPKitError, AssertionError):
    """An exercise checker found wrong results. ``failures`` lists each one, precisely."""

    def __init__(self, message: str, failures: list[str] | None = None):
        super().__init__(message)
        self.failures = list(failures or [])

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: the learner's mistake, not the checker's frames
        return [f"\x1b[31mExerciseFailed\x1b[0m: {self}"]


# --- pipeline (branch: pipeline) ---------------------------------------------------------------

class StageError(WorkerError):
    """A pipeline stage failed: its shard raised, could not be built, or did not answer in time.

    ``stage`` is the stage's index (0 = the first shard), ``process`` the RPC name holding it,
    ``microbatch`` the micro-batch it failed on (``None`` when it failed outside a micro-batch).
    """

    def __init__(self, message: str, *, stage: int, process: str, microbatch: int | None = None):
        super().__init__(message)
        self.stage = stage
        self.process = process
        self.microbatch = microbatch


# --- added on branch pipelining ---------------------------------------------------------------
class StageTimeoutError(StageError, TimeoutError):
    """A torch.distributed.pipelining stage waited longer than its p2p timeout for its neighbour.

    Raised on the stage's rank (the notebook sees it inside a ``RemoteError``); ``process`` is
    ``"rank N"``.
    """


# --- RPC pickling (branch p15) ------------------------------------------------------------------
class RpcPickleError(PPKitError, TypeError):
    """An RPC's function, argument or result cannot be pickled (a lock, an open file, ...)."""


# --- ppkit.spawn (branch spawn) ------------------------------------------------------------------
class ProcessRaisedError(RemoteError):
    """A process of ``ppkit.spawn`` raised, as ``torch.multiprocessing``'s ProcessRaisedException
    says: ``error_index`` is its index (the ``i`` of ``fn(i, *args)``), ``pid`` its process id."""

    def __init__(self, message: str, error: RemoteError, error_index: int, pid: int | None):
        super().__init__(message, error.ranks, error.tracebacks, error.exc_types, error.messages,
                         error.stacks, error.rendezvous)
        self.error_index = error_index
        self.pid = pid


class ProcessExitedError(WorkerDiedError):
    """A process of ``ppkit.spawn`` exited before ``fn`` returned (``sys.exit(3)``, ``os._exit``, a
    signal), as ProcessExitedException says: ``exit_code`` (None if a signal ended it) or
    ``signal_name``; ``error_index`` and ``pid`` as in ``ProcessRaisedError``."""

    def __init__(self, message: str, error_index: int, pid: int | None, exit_code: int | None = None,
                 signal_name: str | None = None, status: int | None = None):
        super().__init__(message, [error_index], status)
        self.error_index = error_index
        self.pid = pid
        self.exit_code = exit_code
        self.signal_name = signal_name


# --- pdb on ranks ---------------------------------------------------------------------
class DebuggerQuit(WorkerError):
    """A pdb session on a rank ended the job: the learner quit (``how`` "quit") or no one could
    answer its prompt ("no stdin": nbval, ``nbconvert --execute``). ``rank``: the rank, ``where``:
    where it stopped, ``restarted``: ppkit restarted the ranks that stayed blocked."""

    def __init__(self, message: str, rank: int, how: str, where: str, restarted: bool):
        super().__init__(message, [rank])
        self.rank, self.how, self.where, self.restarted = rank, how, where, restarted


# --- the parity tool ------------------------------------------------------------------
class ParityError(PPKitError, AssertionError):
    """A parallel run differs from its one-process reference beyond tolerance (``ppkit.compare_runs``).
    ``report``: the ``ParityReport``, whose ``first`` names the step, tensor and rank."""

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report
