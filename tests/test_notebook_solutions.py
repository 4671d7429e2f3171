"""The two halves of a notebook's exercises that nbval's single, solved run leaves to this file.

nbval runs each notebook once, with the registered solutions in its exercise cells, and checks there
that every exercise passes (tests/solved_notebooks.py). What a learner sees before solving anything is
checked here: the stub of each exercise cell, given to its ``workbook.check`` cell, prints exactly the
reminder the notebook ships with (the ``# NBVAL_CHECK_OUTPUT`` output nbval compared when it ran the
notebooks as shipped). A stub never reaches a checker, so no kernel or cluster is needed for it.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import nbformat
import pytest
from solved_notebooks import CHECK_CALL, check_cells, exercise_cells, with_solutions

from ppkit.exercises import workbook
from ppkit.progress import format as progress_format

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


def notebooks_with_exercises() -> list[Path]:
    return [p for p in sorted(NOTEBOOKS.glob("*.ipynb"))
            if '"exercise"' in p.read_text()]


def test_substitution_replaces_the_stub_only():
    nb = nbformat.read(NOTEBOOKS / "06_pipeline.ipynb", as_version=4)
    assert with_solutions(nb) == ["pipeline_time", "best_num_microbatches"]
    cell, second = exercise_cells(nb)
    assert second.source == workbook.solution_source("best_num_microbatches")
    assert cell.source.startswith("import math\n")
    assert "NotImplementedError" not in cell.source
    assert cell.source.endswith(workbook.solution_source("pipeline_time"))


@pytest.mark.parametrize("path", notebooks_with_exercises(), ids=lambda p: p.name)
def test_every_exercise_has_a_solution_and_a_checked_check_cell(path):
    nb = nbformat.read(path, as_version=4)
    checks = [CHECK_CALL.search(cell.source).group(1) for cell in check_cells(nb)]
    assert checks, f"{path.name} has exercise cells but no workbook.check cell"
    assert all("NBVAL_CHECK_OUTPUT" in cell.source for cell in check_cells(nb)), path.name
    assert with_solutions(nb) == checks, f"{path.name}: exercises filled in differ from those checked"


@pytest.mark.parametrize("path", notebooks_with_exercises(), ids=lambda p: p.name)
def test_the_shipped_stubs_print_the_shipped_reminder(path, tmp_path, monkeypatch):
    monkeypatch.setenv(progress_format.DIR_ENV, str(tmp_path / "ppkit-progress"))
    nb = nbformat.read(path, as_version=4)
    for stub, check in zip(exercise_cells(nb), check_cells(nb), strict=True):
        name = CHECK_CALL.search(check.source).group(1)
        source = tmp_path / f"{name}_stub.py"  # a real file: workbook.check reads the stub's source
        source.write_text(stub.source)
        namespace: dict = {}
        exec(compile(stub.source, str(source), "exec"), namespace)  # noqa: S102
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert workbook.check(name, namespace[name]) is None
        shipped = "".join(o.get("text", "") for o in check.outputs if o.get("output_type") == "stream")
        assert printed.getvalue() == shipped, f"{path.name}, {name}"
        assert {r["name"]: r["status"] for r in workbook.progress_rows()}[name] == workbook.NOT_WRITTEN
