"""How pipeline failures end (issue 8): a stage that raises, a stage that never answers, a worker
that cannot import a shard's module; and idle stages cost no CPU."""

from __future__ import annotations

import sys
import textwrap
import time

import psutil
import pytest
import torch
from torch import nn

import ppkit
from ppkit.errors import StageError
from ppkit.pipeline.rpc import PipelineModel


class FailsOnThirdCall(nn.Module):
    """A planted failing stage: the third micro-batch it sees raises."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 3:
            raise ValueError("planted failure in the second stage")
        return self.linear(x)


class Sleeps(nn.Module):
    """A stage that does not answer for a minute."""

    def forward(self, x):
        time.sleep(60)
        return x


def first_shard():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU())


@pytest.fixture(scope="module")
def world():
    with ppkit.start_rpc(num_workers=2) as world:
        yield world


@pytest.mark.slow
def test_failing_stage_raises_stage_error_and_everything_stays_usable(world):
    x = torch.randn(8, 4)
    with PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=2,
                       shards=[ppkit.by_value(first_shard), ppkit.by_value(FailsOnThirdCall)]) as model:
        started = time.monotonic()
        with pytest.raises(StageError) as info:
            model(x)
        assert time.monotonic() - started < 20  # reported at once, not after the RPC timeout
        error = info.value
        assert (error.stage, error.process) == (1, "worker2")
        assert error.microbatch in range(4)
        assert "stage 2 (worker2:cpu) failed: ValueError: planted failure in the second stage" in str(error)
        assert "planted failure" in str(error.__cause__)  # the stage's traceback rides along
        assert isinstance(error, ppkit.WorkerError)
        # the same model runs the next batch (the stage fails on its third call only)
        with torch.no_grad():
            assert model(x).shape == (8, 2)
    # the world restarts without hanging, and a fresh pipeline runs on it
    started = time.monotonic()
    world.restart()
    assert time.monotonic() - started < 60
    with PipelineModel("worker2:cpu,worker1:cpu", microbatch_size=3,
                       shards=[ppkit.by_value(first_shard), ppkit.by_value(FailsOnThirdCall)]) as model:
        with torch.no_grad():
            assert model(torch.randn(4, 4)).shape == (4, 2)
    assert torch.ones(2).add(1).tolist() == [2.0, 2.0]  # the kernel itself is fine


def test_worker_that_cannot_import_the_shard_module_fails_fast(world, tmp_path, monkeypatch):
    # A module only this process can import: the workers started before it was on sys.path.
    (tmp_path / "ppkit_test_local_shards.py").write_text(textwrap.dedent("""
        from torch import nn

        def build():
            return nn.Linear(4, 4)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import ppkit_test_local_shards

    try:
        started = time.monotonic()
        with pytest.raises(StageError) as info:
            PipelineModel("worker1:cpu,worker2:cpu",
                          shards=[ppkit_test_local_shards.build, ppkit_test_local_shards.build])
        assert time.monotonic() - started < 15  # not the 60 s RPC timeout
        message = str(info.value)
        assert "worker1 cannot import 'ppkit_test_local_shards'" in message
        assert "ppkit.by_value" in message
        assert (info.value.stage, info.value.process) == (0, "worker1")
    finally:
        sys.modules.pop("ppkit_test_local_shards", None)


@pytest.mark.slow
def test_idle_workers_with_pipeline_stages_cost_no_cpu(world):
    with PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=2,
                       shards=[ppkit.by_value(first_shard), ppkit.by_value(first_shard)]) as model:
        with torch.no_grad():
            model(torch.randn(8, 4))  # the stages' compute threads exist and now wait
        procs = [psutil.Process(w["pid"]) for w in world.cluster.workers.values()]
        time.sleep(1)
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(10)
        used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before)]
    assert all(u < 0.2 for u in used), f"idle workers used {used} CPU seconds in 10 s (limit 2%)"


@pytest.mark.slow
def test_stage_that_never_answers_times_out_then_close_and_restart_do_not_hang(no_leftovers):
    # its own world, last in this file: start_rpc replaces (closes) the module's world
    world = ppkit.start_rpc(num_workers=2)
    pids = [w["pid"] for w in world.cluster.workers.values()]
    try:
        model = PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=1, timeout=3,
                              shards=[ppkit.by_value(first_shard), ppkit.by_value(Sleeps)])
        started = time.monotonic()
        with pytest.raises(StageError, match=r"stage 2 \(worker2:cpu\) did not answer within 3 s"):
            model(torch.randn(4, 4))
        assert time.monotonic() - started < 20
        started = time.monotonic()
        world.restart()  # while worker2's stage is still asleep
        assert time.monotonic() - started < 60
        with PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=2,
                           shards=[ppkit.by_value(first_shard), ppkit.by_value(first_shard)]) as fresh:
            with torch.no_grad():
                assert fresh(torch.randn(4, 4)).shape == (4, 4)
    finally:
        started = time.monotonic()
        world.close()
        assert time.monotonic() - started < 30
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


class BlockingShard(nn.Module):
    """The tutorial's shard design: ``forward`` waits on ``to_here()`` inside the RPC handler."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x_rref):
        return self.linear(x_rref.to_here())


@pytest.mark.slow
def test_tutorial_design_deadlocks_where_ours_does_not(no_leftovers):
    """With 2 RPC threads per process the tutorial's blocking shards stall at 2 micro-batches in
    flight (until the RPC timeout); ppkit's non-blocking stages run 32 on the same world."""
    from torch.distributed import rpc

    world = ppkit.start_rpc(num_workers=2, num_worker_threads=2, rpc_timeout=5)
    try:
        with PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=1,
                           shards=[ppkit.by_value(first_shard), ppkit.by_value(first_shard)]) as model:
            with torch.no_grad():
                assert model(torch.randn(32, 4)).shape == (32, 4)
        shard1 = rpc.remote("worker1", ppkit.by_value(BlockingShard))
        shard2 = rpc.remote("worker2", ppkit.by_value(BlockingShard))
        # one micro-batch at a time is fine ...
        y_rref = shard1.remote().forward(rpc.RRef(torch.randn(1, 4)))
        assert shard2.rpc_sync().forward(y_rref).shape == (1, 4)
        # ... eight in flight hold every RPC thread in to_here() until the timeout
        futures = []
        for x in torch.randn(8, 4).split(1):
            y_rref = shard1.remote().forward(rpc.RRef(x))
            futures.append(shard2.rpc_async().forward(y_rref))
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="(?i)timeout|timed out"):
            torch.futures.wait_all(futures)
        assert time.monotonic() - started < 30
        world.mark_broken()
    finally:
        started = time.monotonic()
        world.close()
        assert time.monotonic() - started < 30
