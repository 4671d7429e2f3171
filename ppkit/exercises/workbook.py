"""The learner's side of the exercises: check an answer, ask for a hint, see a solution, see progress.

    from ppkit.exercises import workbook
    workbook.check("ring_shift", ring_shift)   # the checker's verdict: passed, or which case is wrong
    workbook.hint("ring_shift")                # the next hint, one per call
    workbook.solution("ring_shift")            # one solution, printed (after the hints, if you like)
    workbook.progress()                        # every exercise and how it went on this machine

The exercises themselves (checker, solution, hints) are registered in ``ppkit.exercises.catalog``.
Each check is appended to the learner's progress record (ppkit/progress/: ``ppkit progress`` shows it, ``ppkit
progress --off`` stops it), the one store that ``progress()`` and ``ppkit exercises`` read too.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import time
from contextlib import nullcontext

from ppkit.checks import check_callable
from ppkit.errors import ExerciseFailed
from ppkit.exercises import catalog, solutions
from ppkit.progress import hooks as progress_record

PASSED, FAILED, NOT_WRITTEN, NOT_TRIED = "passed", "failed", "not written yet", "not tried"

_hints_given: dict[str, int] = {}


def check(name: str, fn, **options):
    """Run exercise ``name``'s checker on ``fn`` and record the outcome.

    A stub (only ``raise NotImplementedError``) gets a one-line reminder and returns None, so a
    notebook as shipped runs from top to bottom. A wrong answer raises ``ExerciseFailed`` with the
    checker's explanation; a right one prints the checker's summary and returns its report.
    ``options`` go to the checker (e.g. ``cluster=`` or ``timeout=``).
    """
    exercise = catalog.get(name)
    check_callable(fn, exercise.signature)
    if is_stub(fn):
        return _not_written(name)
    try:
        report = exercise.checker(fn, **options)
    except NotImplementedError:
        return _not_written(name)
    except ExerciseFailed as err:
        if "NotImplementedError" in str(err):  # raised on a rank, still unwritten there
            return _not_written(name)
        _record(name, FAILED, err)
        raise
    _record(name, PASSED)
    return report


def _not_written(name: str) -> None:
    print(f"{name}: not written yet: replace the NotImplementedError in {name} (the cell above) with "
          f"your code, then run both cells again. workbook.hint({name!r}) gives a hint.")
    _record(name, NOT_WRITTEN)


def is_stub(fn) -> bool:
    """True when ``fn``'s body is only a docstring and ``raise NotImplementedError``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):  # no source to read (a builtin, a lambda in a string)
        return False
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def hint(name: str) -> None:
    """Print the next hint for exercise ``name``; after the last one, say where the solution is."""
    hints = catalog.get(name).hints
    given = _hints_given.get(name, 0)
    if given >= len(hints):
        print(f"{name}: that was the last hint. workbook.solution({name!r}) shows one solution.")
        return
    _hints_given[name] = given + 1
    print(f"{name}, hint {given + 1} of {len(hints)}: {hints[given]}")


def solution_source(name: str) -> str:
    """The source of the registered solution: exactly what goes into the exercise cell."""
    return inspect.getsource(catalog.get(name).solution)


def solution(name: str) -> None:
    """Print one solution of exercise ``name`` and how to load it into a cell."""
    print(f"# One solution for {name} (notebook {catalog.get(name).notebook}). To put it in a cell:\n"
          f"# %load -s {name} {inspect.getfile(solutions)}\n")
    print(solution_source(name))


def verify_solution(name: str, **options):
    """Run the checker on the registered solution, outside any notebook (for tests and instructors)."""
    exercise = catalog.get(name)
    with exercise.context() if exercise.context else nullcontext({}) as provided:
        return exercise.checker(exercise.solution, **{**provided, **options})


# -- progress ------------------------------------------------------------------------------------

def _record(name: str, status: str, error: ExerciseFailed | None = None) -> None:
    progress_record.checked(name, status, error)  # the learner's progress record: never raises


_STATUS_WORDS = {v: k for k, v in progress_record.WORKBOOK_STATUSES.items()}  # the record's words -> ours


def progress_rows() -> list[dict]:
    """One row per exercise, in course order: name, notebook, status, when (its last check; empty if never
    checked), from the learner's progress record. An exercise is "passed" once it passed, in any notebook."""
    from ppkit.progress import read

    record = read.read_folder()
    if record.problems:
        print(f"(the progress record could not be read in full: {'; '.join(record.problems)})", file=sys.stderr)
    seen: dict[str, list] = {}
    for book in record.notebooks:
        for state in book.exercises:
            seen.setdefault(state.exercise, []).append(state)
    rows = []
    for e in catalog.EXERCISES:
        states = seen.get(e.name, [])
        last = max(states, key=lambda s: s.t, default=None)
        status = PASSED if any(s.status == "passed" for s in states) else (
            _STATUS_WORDS.get(last.status, last.status) if last else NOT_TRIED)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last.t)) if last else ""
        rows.append({"name": e.name, "notebook": e.notebook, "status": status, "when": when})
    return rows


def format_progress(rows: list[dict]) -> str:
    from ppkit.progress.format import record_dir

    done = sum(r["status"] == PASSED for r in rows)
    width = max(len(r["name"]) for r in rows)
    nb_width = max(len(r["notebook"]) for r in rows)
    lines = [f"{r['notebook']:<{nb_width}}  {r['name']:<{width}}  {r['status']:<15}  {r['when']}".rstrip()
             for r in rows]
    return "\n".join([*lines, f"{done} of {len(rows)} exercises passed on this machine ({record_dir()})"])


def progress() -> None:
    """Print every exercise, its notebook, and how it went on this machine (from the progress record)."""
    print(format_progress(progress_rows()))
