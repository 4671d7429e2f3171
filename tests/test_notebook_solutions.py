"""Each notebook run with the registered solutions in its exercise cells: every check passes.

nbval runs the notebooks as shipped (stubs: "not written yet"); this runs them as a learner who solved
every exercise would, so a solution and its notebook (names, imports, the check's options) never
drift apart. The outcome is read from the progress record that ``workbook.check`` keeps.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ppkit.exercises import catalog, workbook

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"

pytestmark = pytest.mark.timeout(600)


def with_solutions(nb) -> list[str]:
    """Put each registered solution in place of its stub (in ``nb``); return the exercises filled in.

    What precedes the ``def`` in an exercise cell (an import the stub needs) is kept."""
    filled = []
    for cell in nb.cells:
        if cell.cell_type != "code" or "exercise" not in cell.metadata.get("tags", []):
            continue
        for exercise in catalog.EXERCISES:
            match = re.search(rf"^def {exercise.name}\(", cell.source, flags=re.MULTILINE)
            if match:
                cell.source = cell.source[:match.start()] + workbook.solution_source(exercise.name)
                filled.append(exercise.name)
    return filled


def notebooks_with_exercises() -> list[Path]:
    return [p for p in sorted(NOTEBOOKS.glob("*.ipynb"))
            if '"exercise"' in p.read_text()]


def test_substitution_replaces_the_stub_only():
    nb = nbformat.read(NOTEBOOKS / "06_pipeline.ipynb", as_version=4)
    assert with_solutions(nb) == ["pipeline_time", "best_num_microbatches"]
    cell, second = [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]
    assert second.source == workbook.solution_source("best_num_microbatches")
    assert cell.source.startswith("import math\n")
    assert "NotImplementedError" not in cell.source
    assert cell.source.endswith(workbook.solution_source("pipeline_time"))


@pytest.mark.parametrize("path", notebooks_with_exercises(), ids=lambda p: p.name)
def test_notebook_passes_with_its_solutions(path, tmp_path, monkeypatch, no_leftovers):
    nb = nbformat.read(path, as_version=4)
    filled = with_solutions(nb)
    assert filled, f"{path.name} has exercise cells but none defines a registered exercise"
    progress = tmp_path / "progress.json"
    monkeypatch.setenv(workbook.PROGRESS_ENV, str(progress))  # the kernel inherits it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outcome = {name: entry["status"] for name, entry in json.loads(progress.read_text()).items()}
    assert outcome == {name: workbook.PASSED for name in filled}
