"""What records, in the record's words: a check's outcome, a ppkit error raised in a cell, a
ppkit.spawn / %%torchrun job's state, a preflight verdict. The exercises, the cluster and preflight
call these (or ``ppkit.progress.note``); none of them raises.
"""

from __future__ import annotations

from ppkit.errors import (
    PPKitError,
    ProcessExitedError,
    ProcessRaisedError,
    RemoteError,
    WorkerDiedError,
)
from ppkit.progress import note
from ppkit.progress.format import first_line

WORKBOOK_STATUSES = {"passed": "passed", "failed": "failed", "not written yet": "not written"}
_RECORDED = "_ppkit_recorded_as_check"  # set on an error recorded as a failed check: not recorded again as an error


def checked(exercise: str, status: str, error: BaseException | None = None) -> None:
    """A ``workbook.check`` outcome (the workbook's status words); ``error``: the checker's, when failed."""
    reason = first_line(error) if status == "failed" and error is not None else None
    note("check", exercise=exercise, status=WORKBOOK_STATUSES.get(status, status), reason=reason)
    if error is not None:
        setattr(error, _RECORDED, True)


# -- errors raised in a Jupyter kernel's cells ---------------------------------------------------

def register(shell) -> None:
    """Record each ppkit error a cell of ``shell`` raises; once, however often ppkit is imported."""
    try:
        callbacks = shell.events.callbacks["post_run_cell"]
        if _after_cell not in callbacks:
            shell.events.register("post_run_cell", _after_cell)
    except Exception:  # noqa: BLE001 - an IPython without events: nothing recorded, the import goes on
        pass


def _after_cell(result) -> None:
    error = getattr(result, "error_in_exec", None)
    # a failed check is already recorded, by workbook.check, as a failed check: once is the truth. An ExerciseFailed
    # raised elsewhere (the learner's own check, a checker called directly) is an error like any other.
    if isinstance(error, PPKitError) and not getattr(error, _RECORDED, False):
        note("error", error=type(error).__name__, message=first_line(error) or "(no message)")


# -- a ppkit.spawn / %%torchrun job --------------------------------------------------------------

def job_started(caller: str, world_size: int) -> None:
    note("cluster", state="running", detail=f"{caller}: {world_size} rank(s) started")


def job_ended(caller: str, world_size: int, error: BaseException | None) -> None:
    """The job's end: finished when ``error`` is None; stopped when the learner stopped it herself (Kernel >
    Interrupt, Ctrl-C: a KeyboardInterrupt, as ppkit's JobInterrupted is), which is not trouble; else died, naming
    the rank and how it ended."""
    if error is None:
        note("cluster", state="finished", detail=f"{caller}: all {world_size} rank(s) finished")
    elif isinstance(error, KeyboardInterrupt):
        note("cluster", state="stopped", detail=f"{caller}: stopped by Kernel > Interrupt")
    else:
        note("cluster", state="died", detail=f"{caller}: {_how_it_ended(error)}")


def _how_it_ended(error: BaseException) -> str:
    if isinstance(error, ProcessExitedError):
        how = (f"exited with code {error.exit_code}" if error.exit_code is not None
               else f"was killed by signal {error.signal_name}" if error.signal_name else "ended")
        return f"rank {error.error_index} {how}"
    if isinstance(error, ProcessRaisedError):
        rank = error.error_index
        return f"rank {rank} raised {error.exc_types.get(rank)}: {first_line(error.messages.get(rank, ''))}"
    if isinstance(error, (RemoteError, WorkerDiedError)) and error.ranks:
        return f"rank {error.ranks[0]}: {type(error).__name__}: {first_line(error)}"
    return f"{type(error).__name__}: {first_line(error)}"


# -- preflight -----------------------------------------------------------------------------------

def preflight_done(checks: list, summary: str) -> None:
    """``ppkit preflight``'s verdict from its checks (checklist.Check): not ready if one is not fine."""
    if not all(check.fine for check in checks):
        verdict = "not ready"
    elif any(check.status == "warn" for check in checks):
        verdict = "warnings"
    else:
        verdict = "ready"
    note("preflight", verdict=verdict, summary=summary)
