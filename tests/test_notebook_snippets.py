"""Notebook code that reaches into ppkit's internals, checked against them without running the notebook.

nbval runs these cells, but where a cell's output depends on the machine it is not compared, so a snippet that
no longer fits ppkit would still pass there while the learner sees a traceback.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def assigned_string(notebook: str, name: str) -> str:
    """The string constant that notebook ``notebook`` assigns to ``name`` in one of its code cells."""
    cells = json.loads((REPO / "notebooks" / notebook).read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        for node in ast.parse("".join(cell["source"])).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
                return ast.literal_eval(node.value)
    raise AssertionError(f"{notebook} assigns no {name}")


def test_notebook_07s_old_torch_worker_really_claims_torch_2_3():
    # "Failure 3: different versions" patches what the worker reports. When versions() became a Versions
    # dataclass, the old dict-style patch crashed the worker with a TypeError: the lesson showed that traceback
    # and the master's 60 s start timeout instead of the version refusal it is about.
    fake = assigned_string("07_two_machines.ipynb", "FAKE_OLD_TORCH")
    patch, _, launch = fake.partition("from ppkit.cli import main")
    assert launch, fake  # the rest starts ppkit's command line, as `ppkit worker` would
    done = subprocess.run([sys.executable, "-c", patch + "print(w.versions().torch)"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2.3.0"
