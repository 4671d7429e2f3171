"""The DDP tutorial's shape (ppkit/lessons/ddp_tutorial.py: its set-up, model and demos), run with ppkit.spawn in
place of mp.spawn: each demo 5 times in a row on the tutorial's fixed port (each reuse of the port is what could
fail; benchmarks/bench_ddp_tutorial.py runs the full soak, 20 or more), without a hang or a leftover process, its
functions and classes living in ``__main__`` as in a notebook cell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from leftovers import ppkit_children, wait_gone

from ppkit.cluster.spawn import call as spawn_call
from ppkit.lessons import ddp_tutorial

pytestmark = pytest.mark.slow  # slow: make test-fast leaves it out

ROOT = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("PPKIT_DDP_TUTORIAL_RUNS", "5"))  # the benchmark sets 20
PRINTS = {"demo_basic": "basic DDP demo on rank {}",
          "demo_checkpoint": "DDP checkpoint demo on rank {}",
          "demo_model_parallel": "DDP with model parallel demo on rank {}"}


@pytest.fixture(scope="module", autouse=True)
def _close_fork_servers():
    yield
    spawn_call.close()


def tutorial_cell() -> dict:
    """The block run as IPython runs a cell: its functions and classes belong to ``__main__``."""
    namespace = {"__name__": "__main__"}
    exec(compile(ddp_tutorial.tutorial_source(), "<cell>", "exec"), namespace)
    return namespace


def rank_processes() -> list[int]:
    me = os.getpid()
    return [p.pid for p in ppkit_children()
            if not (p.ppid() == me and "ppkit.transport.zygote" in " ".join(p.cmdline()))]


def test_notebook_03_pastes_the_same_code():
    notebook = json.loads((ROOT / "notebooks" / "03_data_parallel.ipynb").read_text())
    sources = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert ddp_tutorial.tutorial_source() in sources
    assert 'os.environ["MASTER_PORT"] = "12355"' in ddp_tutorial.tutorial_source()
    assert "ppkit.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)" in ddp_tutorial.tutorial_source()


def test_the_cells_functions_are_shipped_by_value():
    cell = tutorial_cell()
    assert cell["demo_basic"].__module__ == "__main__" and cell["ToyModel"].__module__ == "__main__"


@pytest.mark.parametrize("demo", ddp_tutorial.DEMOS)
def test_each_demo_runs_again_and_again_on_the_fixed_port(demo, capsys):
    cell = tutorial_cell()
    took = []
    for run in range(RUNS):
        started = time.monotonic()
        cell["run_demo"](cell[demo], 2)
        took.append(time.monotonic() - started)
        out = capsys.readouterr().out
        for rank in (0, 1):
            assert f"[rank {rank}] {PRINTS[demo].format(rank)}" in out, f"run {run}: {out}"
        assert wait_gone(rank_processes(), timeout=5.0) == [], f"run {run} left processes"
    with capsys.disabled():
        print(f"\n{demo}: {RUNS} runs, first {took[0]:.2f} s, median {sorted(took)[RUNS // 2]:.2f} s, "
              f"slowest {max(took):.2f} s")


def test_the_tutorial_runs_as_a_script_with_its_functions_in_main():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "ppkit.lessons.ddp_tutorial"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "each demo ran twice on 2 processes"
    assert sorted(lines[:-1]) == sorted(f"[rank {r}] {text.format(r)}" for text in PRINTS.values()
                                        for r in (0, 1) for _ in range(2))
