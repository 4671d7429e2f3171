"""What every check in ppkit reports, one type for all of them: ``ppkit doctor`` (is this machine's
network right for a run across machines), ``ppkit preflight`` (is this machine ready for the course)
and the exercise checkers (is a learner's function right).

A ``Check`` is one thing looked at: its name, a status, what was found and, when it is not fine,
what to do. A ``Checklist`` keeps them in order and says whether all is well (``ok``) and what is
not (``problems``). What a status means is decided here once; each tool only lays the lines out its
own way (doctor's table, preflight's line per check, an exercise's summary).
"""

from __future__ import annotations

from dataclasses import dataclass, field

STATUSES = ("ok", "info", "warn", "FAIL", "skip")
FINE = ("ok", "info", "warn")  # a warning is allowed; a failure, or a check that could not run, is not


@dataclass
class Check:
    """One thing checked; ``fix`` says what to do when ``status`` is not fine ("" if nothing)."""

    name: str
    status: str  # one of STATUSES
    detail: str = ""
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r} has status {self.status!r}; a check's status is one of "
                             f"{', '.join(STATUSES)}")

    @property
    def fine(self) -> bool:
        return self.status in FINE


@dataclass
class Checklist:
    """Checks in the order they ran."""

    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str = "", fix: str = "") -> Check:
        check = Check(name, status, detail, fix)
        self.checks.append(check)
        return check

    def status_of(self, name: str) -> str | None:
        """The status of the first check called ``name``; None if there is none."""
        return next((c.status for c in self.checks if c.name == name), None)

    @property
    def ok(self) -> bool:
        """True when every check is fine (warnings allowed)."""
        return all(c.fine for c in self.checks)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if not c.fine]
