"""What an exercise checker returns or raises: the cases it ran and every problem it found.

Every checker (``check_basics``, ``check_pipeline``, ``check_launch``, ``check_sharding``, ...)
ends with ``raise_or_report``, so a notebook catches one ``ExerciseFailed`` and prints one report.
A report is a checklist (ppkit/checklist.py), as doctor's and preflight's are: each case that ran
is an ``info`` check, each problem a ``FAIL`` check of the case it was found in.
"""

from __future__ import annotations

from ppkit.checklist import Checklist
from ppkit.errors import ExerciseFailed

MAX_REPORTED = 8  # failures listed in the message; all of them stay in .failures


class CheckReport(Checklist):
    """What a checker ran for ``exercise``. ``failures`` is empty when it passed."""

    def __init__(self, exercise: str):
        super().__init__()
        self.exercise = exercise

    def case(self, *names: str) -> None:
        """The checker ran these cases."""
        for name in names:
            self.add(name, "info")

    def fail(self, *problems: str) -> None:
        """The checker found these problems (in the case it ran last)."""
        case = self.cases[-1] if self.cases else self.exercise
        for problem in problems:
            self.add(case, "FAIL", problem)

    def answer(self, label: str, fn, args: tuple, convert, what: str):
        """Call the learner's ``fn(*args)`` here and ``convert`` its answer; None after reporting why
        there is none to compare: it raised, or it is not ``what`` at all (``convert`` gave None)."""
        try:
            got = fn(*args)
        except Exception as exc:  # the learner's bug is a finding, not a crash of the checker
            self.fail(f"{label}: your function raised {type(exc).__name__}: {exc}")
            return None
        value = convert(got)
        if value is None:
            self.fail(f"{label}: expected {what}, got {type(got).__name__} {got!r:.60}")
        return value

    # read-only views (tuples, so an old-style ``report.cases.append(...)`` fails loudly instead of
    # being dropped): add with ``case`` and ``fail``
    @property
    def cases(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.checks if c.status == "info")

    @property
    def failures(self) -> tuple[str, ...]:
        return tuple(c.detail for c in self.problems)

    @property
    def passed(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        cases, failures = self.cases, self.failures
        if not failures:
            return f"{self.exercise}: passed all {len(cases)} cases ({'; '.join(cases)})."
        shown = failures[:MAX_REPORTED]
        more = len(failures) - len(shown)
        return (f"{self.exercise}: {len(failures)} problem(s) in {len(cases)} cases:\n  - "
                + "\n  - ".join(shown) + (f"\n  ... and {more} more (see .failures)" if more else ""))


def raise_or_report(report: CheckReport) -> CheckReport:
    """Raise ``ExerciseFailed`` naming every problem, or print the report and return it."""
    if report.failures:
        raise ExerciseFailed(str(report), report.failures)
    print(report)
    return report
