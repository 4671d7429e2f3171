"""nbval runs each notebook once, as a learner who solved every exercise would (a plain module: the
repository's conftest.py wires it into nbval's collection).

Each exercise cell gets its registered solution in place of the stub, so a solution and its notebook
(names, imports, the check's options) never drift apart. In that same run nbval still compares every
``# NBVAL_CHECK_OUTPUT`` cell with the notebook as shipped, except the ``workbook.check`` cells: their
shipped output is the stub's reminder ("not written yet"), which tests/test_notebook_solutions.py compares
on its own (the stub never reaches a checker, so it needs no kernel). A wrong solution makes its check
cell raise ``ExerciseFailed``; a last item per notebook, "exercises passed", then reads the progress record
``workbook.check`` kept in that kernel (every filled exercise must read "passed"), stops the kernel and
fails if a ppkit process outlived it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from leftovers import LEFTOVER_WAIT_S, end_leftovers, ppkit_children
from nbval.plugin import IPyNbFile

from ppkit.exercises import catalog, workbook
from ppkit.progress import format as progress_format
from ppkit.progress import read as progress_read

CHECK_CALL = re.compile(r"workbook\.check\(\s*[\"'](\w+)[\"']")


def with_solutions(nb) -> list[str]:
    """Put each registered solution in place of its stub (in ``nb``); return the exercises filled in.

    What precedes the ``def`` in an exercise cell (an import the stub needs) is kept."""
    filled = []
    for cell in exercise_cells(nb):
        for exercise in catalog.EXERCISES:
            match = re.search(rf"^def {exercise.name}\(", cell.source, flags=re.MULTILINE)
            if match:
                cell.source = cell.source[:match.start()] + workbook.solution_source(exercise.name)
                filled.append(exercise.name)
    return filled


def exercise_cells(nb) -> list:
    return [cell for cell in nb.cells
            if cell.cell_type == "code" and "exercise" in cell.metadata.get("tags", [])]


def check_cells(nb) -> list:
    """The code cells that call ``workbook.check``, in order."""
    return [cell for cell in nb.cells if cell.cell_type == "code" and CHECK_CALL.search(cell.source)]


class SolvedNotebook(IPyNbFile):
    """nbval's notebook, collected with its solutions filled in, plus the "exercises passed" item."""

    filled: list[str]
    progress: Path | None = None

    def collect(self):
        cells = list(super().collect())  # reads self.nb; each item keeps a reference to its cell
        self.filled = with_solutions(self.nb)
        checks = {id(cell) for cell in check_cells(self.nb)}
        for item in cells:
            if id(item.cell) in checks:
                item.options["check"] = False  # the shipped output is the stub's; see the module docstring
        yield from cells
        if self.filled:
            yield ExercisesPassed.from_parent(self, name="exercises passed")

    def setup(self):
        # The kernel starts here and inherits os.environ: its own progress record, and the owner mark
        # that tells this run's ppkit processes from others' (tests/conftest.py sets it too).
        self.progress = Path(tempfile.mkdtemp(prefix="ppkit-nbval-")) / "ppkit-progress"
        saved = os.environ.get(progress_format.DIR_ENV)
        os.environ[progress_format.DIR_ENV] = str(self.progress)
        os.environ.setdefault("PPKIT_TEST_OWNER", str(os.getpid()))
        try:
            super().setup()
        finally:
            if saved is None:
                os.environ.pop(progress_format.DIR_ENV, None)
            else:
                os.environ[progress_format.DIR_ENV] = saved

    def teardown(self):
        super().teardown()
        if self.progress is not None:
            shutil.rmtree(self.progress.parent, ignore_errors=True)


class ExercisesPassed(pytest.Item):
    """Every exercise filled in passed its check in this kernel; no ppkit process outlives the kernel."""

    def runtest(self):
        notebook: SolvedNotebook = self.parent
        name = Path(str(notebook.path)).name
        record = progress_read.read_folder(notebook.progress)
        assert not record.problems, f"{name}: the progress record could not be read: {record.problems}"
        outcome = {state.exercise: state.status for book in record.notebooks for state in book.exercises}
        assert outcome == {exercise: workbook.PASSED for exercise in notebook.filled}, (
            f"{name} with its solutions filled in: {outcome}")
        if notebook.kernel is not None and notebook.kernel.is_alive():
            notebook.kernel.stop()
        left = end_leftovers([p.pid for p in ppkit_children()], timeout=LEFTOVER_WAIT_S)
        assert not left, f"{name}: ppkit processes outlived its kernel (now killed): {left}"

    def reportinfo(self):
        return self.path, 0, f"{self.path.name}: exercises passed"
