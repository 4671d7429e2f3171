"""The RPC pipeline tutorial's code (seed 003) as written, on ppkit's RPC world.

Its classes must live in ``__main__``, as they do when pasted into a notebook cell: the script
test runs ``python -m ppkit.lessons.seed003``; the others ``exec`` the block with
``__name__ == "__main__"``, as IPython runs a cell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed import autograd as dist_autograd
from torch.distributed import rpc

import ppkit
from ppkit.lessons import rpc_basics, seed003

ROOT = Path(__file__).resolve().parent.parent


def tutorial_cell() -> dict:
    namespace = {"__name__": "__main__"}
    exec(compile(seed003.tutorial_source(), "<cell>", "exec"), namespace)
    return namespace


def test_notebook_04_pastes_the_same_code():
    notebook = json.loads((ROOT / "notebooks" / "04_rpc_rref.ipynb").read_text())
    sources = ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert seed003.tutorial_source() in sources
    assert seed003.tutorial_source().startswith("import threading\n")
    assert "class DistResNet50(nn.Module):" in seed003.tutorial_source()


@pytest.mark.slow
def test_the_tutorial_runs_as_a_script_with_its_classes_in_main():
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "ppkit.lessons.seed003"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["Processing batch 0",
                                        "trained 1 batch of 8 on worker1, worker2"]


def test_seconds_until_done_times_returns_gives_up_and_raises():
    took = rpc_basics.seconds_until_done(lambda: time.sleep(0.05), deadline=10)
    assert took is not None and 0.05 <= took < 10
    assert rpc_basics.seconds_until_done(lambda: time.sleep(2), deadline=0.1) is None
    with pytest.raises(ZeroDivisionError):
        rpc_basics.seconds_until_done(lambda: 1 / 0, deadline=10)


@pytest.fixture(scope="module")
def world():
    w = ppkit.start_rpc(2, num_worker_threads=4, rpc_timeout=60)
    yield w
    w.close()


@pytest.mark.slow
def test_the_tutorials_classes_train_with_distributed_optimizer_and_autograd(world):
    tutorial = tutorial_cell()
    torch.manual_seed(0)
    model = tutorial["DistResNet50"](2, ["worker1", "worker2"])
    params = model.parameter_rrefs()  # the owners send ResNetShard1/2 back to the master first
    assert {p.owner().name for p in params} == {"worker1", "worker2"}
    before = [p.to_here() for p in (params[0], params[-1])]
    opt = tutorial["DistributedOptimizer"](torch.optim.SGD, params, lr=0.05)
    inputs, labels = torch.randn(4, 3, 32, 32), torch.zeros(4, 1000)
    with dist_autograd.context() as context_id:
        outputs = model(inputs)  # 2 micro-batches of 2: fewer than the 4 RPC threads
        loss = torch.nn.functional.mse_loss(outputs, labels)
        dist_autograd.backward(context_id, [loss])
        opt.step(context_id)
    assert outputs.shape == (4, 1000) and torch.isfinite(loss)
    after = [p.to_here() for p in (params[0], params[-1])]
    assert all(not torch.equal(b, a) for b, a in zip(before, after))  # both shards stepped


@pytest.mark.slow
def test_more_micro_batches_than_rpc_threads_hang_the_tutorials_shards_until_the_timeout(world):
    """What notebook 04 says: with 4 RPC threads, 8 micro-batches wait in to_here() for good."""
    tutorial = tutorial_cell()
    model = tutorial["DistResNet50"](2, ["worker1", "worker2"])
    model.parameter_rrefs()  # built, under the world's 60 s timeout
    rpc._set_rpc_timeout(5)  # the master's new calls get 5 s
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="timeout"), torch.no_grad():
        rpc_basics.seconds_until_done(lambda: model(torch.randn(16, 3, 32, 32)), deadline=60)
    assert time.monotonic() - started >= 5
    world.mark_broken()
