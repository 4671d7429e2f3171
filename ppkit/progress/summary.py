"""What a record's events add up to: per notebook, each exercise's outcome, the last error and the last cluster
state; and the last preflight verdict. Plain dataclasses, built by ``summarise``.

An exercise's outcome has one meaning wherever it is shown (``ppkit progress``, ``ppkit exercises``, the
instructor's room): "passed" once it passed, whatever came later (a failure after the pass is kept, and shown, as
``failed_since_pass``); else the last check's "failed" or "not written".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Event:
    """One line of the record. ``fields``: the kind's own (exercise, status, reason, error, message,
    state, seconds, detail, verdict, summary)."""

    kind: str
    t: float
    notebook: str | None
    pid: int | None
    fields: dict


@dataclass
class ExerciseState:
    """An exercise as checked in one notebook: its ``status`` ("passed" once passed, else the last check's) and the
    last check's time ``t``; how many checks and failures; the last failure's ``reason`` and time; when it first
    passed (None: never); whether a check failed after its last pass."""

    exercise: str
    status: str
    t: float
    checks: int = 0
    failures: int = 0
    reason: str = ""
    failed_t: float | None = None
    passed_t: float | None = None
    failed_since_pass: bool = False


@dataclass
class ErrorSeen:
    error: str
    message: str
    t: float


@dataclass
class ClusterSeen:
    state: str
    detail: str
    t: float
    seconds: float | None = None  # hung: how long every rank had waited


@dataclass
class PreflightSeen:
    verdict: str
    summary: str
    t: float


@dataclass
class NotebookSummary:
    """One notebook (``None``: events from outside a Jupyter session, e.g. a script or ``ppkit`` command)."""

    notebook: str | None
    exercises: list[ExerciseState] = field(default_factory=list)
    errors: int = 0
    last_error: ErrorSeen | None = None
    last_cluster: ClusterSeen | None = None
    last_t: float = 0.0

    def with_status(self, status: str) -> list[str]:
        return [e.exercise for e in self.exercises if e.status == status]


def summarise(events: list[Event]) -> tuple[list[NotebookSummary], PreflightSeen | None]:
    """Per-notebook summaries (in the order each notebook was first seen) and the last preflight verdict.
    ``events`` in time order."""
    notebooks: dict[str | None, NotebookSummary] = {}
    exercises: dict[tuple, ExerciseState] = {}
    preflight = None
    for ev in events:
        f = ev.fields
        if ev.kind == "preflight":
            preflight = PreflightSeen(f["verdict"], f["summary"], ev.t)
            continue
        book = notebooks.setdefault(ev.notebook, NotebookSummary(ev.notebook))
        book.last_t = max(book.last_t, ev.t)
        if ev.kind == "check":
            key = (ev.notebook, f["exercise"])
            state = exercises.get(key)
            if state is None:
                state = exercises[key] = ExerciseState(f["exercise"], f["status"], ev.t)
                book.exercises.append(state)
            _checked(state, ev)
        elif ev.kind == "error":
            book.errors += 1
            book.last_error = ErrorSeen(f["error"], f["message"], ev.t)
        elif ev.kind == "cluster":
            book.last_cluster = ClusterSeen(f["state"], f["detail"], ev.t, f.get("seconds"))
    return list(notebooks.values()), preflight


def _checked(state: ExerciseState, ev: Event) -> None:
    status = ev.fields["status"]
    state.t = ev.t
    state.checks += 1
    if status == "failed":
        state.failures += 1
        state.reason, state.failed_t = ev.fields.get("reason", ""), ev.t
    elif status == "passed":
        state.passed_t = ev.t if state.passed_t is None else state.passed_t
        state.failed_since_pass = False
    if state.passed_t is not None:
        state.status = "passed"
        state.failed_since_pass = state.failed_since_pass or status == "failed"
    else:
        state.status = status
