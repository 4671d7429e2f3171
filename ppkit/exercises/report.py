"""What an exercise checker returns or raises: the cases it ran and every problem it found.

Every checker (``exercises``, ``check_pipeline``, ``check_launch``, ``check_sharding``)
ends with ``raise_or_report``, so a notebook catches one ``ExerciseFailed`` and prints one report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppkit.errors import ExerciseFailed

MAX_REPORTED = 8  # failures listed in the message; all of them stay in .failures


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


def raise_or_report(report: CheckReport) -> CheckReport:
    """Raise ``ExerciseFailed`` naming every problem, or print the report and return it."""
    if report.failures:
        raise ExerciseFailed(str(report), report.failures)
    print(report)
    return report
