"""The RPC world: the test process is the RPC master, as the notebook kernel is in lesson 04."""

from __future__ import annotations

import time

import psutil
import pytest
import torch
from torch.distributed import autograd as dist_autograd
from torch.distributed import rpc

import ppkit
from ppkit.lessons import rpc_basics


def square(x):  # defined in the test module: RPC would send it by reference
    return x * x


@pytest.fixture(scope="module")
def world():
    w = ppkit.start_rpc(2, rpc_timeout=20)
    yield w
    w.close()


def test_names_and_builtin_calls(world):
    assert world.names == ["master", "worker1", "worker2"]
    assert rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]
    fut = rpc.rpc_async("worker2", torch.mul, args=(torch.ones(2), 3))
    assert fut.wait().tolist() == [3.0, 3.0]
    rref = rpc.remote("worker1", torch.add, args=(torch.zeros(3), 0))
    assert rref.owner().name == "worker1"
    assert rref.to_here().tolist() == [0.0, 0.0, 0.0]


def test_a_function_the_worker_cannot_import_travels_by_value_with_or_without_the_wrapper(world):
    def cube(x):  # a local function: no worker could import it by name
        return x ** 3

    assert rpc.rpc_sync("worker1", ppkit.by_value(cube), args=(2,)) == 8
    assert rpc.rpc_sync("worker1", cube, args=(3,)) == 27  # ppkit's RPC pickler sends it by value


def test_by_value_rejects_non_callables():
    with pytest.raises(ppkit.ConfigError, match="function or class"):
        ppkit.by_value(3)


def test_distributed_autograd_matches_local(world):
    layers = rpc_basics.build_remote_mlp(("worker1", "worker2"), seeds=(1, 2))
    local = rpc_basics.local_copy((1, 2))
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    with dist_autograd.context() as ctx:
        loss = rpc_basics.remote_forward(layers, x).sum()
        dist_autograd.backward(ctx, [loss])
        remote = rpc_basics.remote_grads(layers, ctx)
    local(x).sum().backward()
    assert torch.allclose(remote[0]["linear.weight"], local[0].linear.weight.grad, atol=1e-6)
    assert torch.allclose(remote[1]["linear.bias"], local[2].linear.bias.grad, atol=1e-6)


def test_per_worker_optimizer_matches_local_sgd(world):
    layers = rpc_basics.build_remote_mlp(("worker1", "worker2"), seeds=(3, 4))
    local = rpc_basics.local_copy((3, 4))
    opt = torch.optim.SGD(local.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randn(5, 4, generator=torch.Generator().manual_seed(step))
        with dist_autograd.context() as ctx:
            dist_autograd.backward(ctx, [rpc_basics.remote_forward(layers, x).pow(2).sum()])
            rpc_basics.remote_step(layers, ctx)
        opt.zero_grad()
        local(x).pow(2).sum().backward()
        opt.step()
    states = rpc_basics.remote_state(layers)
    assert torch.allclose(states[0]["linear.weight"], local[0].linear.weight, atol=1e-5)
    assert torch.allclose(states[1]["linear.weight"], local[2].linear.weight, atol=1e-5)


def test_exercise_checker_accepts_right_and_names_wrong_case(world):
    def right(rrefs):
        return torch.stack([r.to_here() for r in rrefs]).sum(0)

    def wrong(rrefs):  # forgets all but the first
        return rrefs[0].to_here()

    assert "passed 3 cases" in rpc_basics.check_remote_sum(right, world.worker_names)
    with pytest.raises(AssertionError, match=r"case 2 \(2 tensors of shape \(2, 2\)"):
        rpc_basics.check_remote_sum(wrong, world.worker_names)


@pytest.mark.slow
def test_restart_gives_a_working_world_and_idle_workers_cost_no_cpu(world):
    world.restart()
    assert rpc.rpc_sync("worker2", torch.add, args=(1, 2)) == 3
    procs = [psutil.Process(w["pid"]) for w in world.cluster.workers.values()]
    before = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(10)
    used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before)]
    assert all(u < 0.2 for u in used), f"idle workers used {used} CPU seconds in 10 s (limit 2%)"


@pytest.mark.slow
def test_timed_out_rpc_then_close_never_hangs_and_kernel_stays_usable(no_leftovers):
    w = ppkit.start_rpc(1, num_worker_threads=2, rpc_timeout=2)
    pids = [x["pid"] for x in w.cluster.workers.values()]

    def stuck():
        import time as t
        t.sleep(60)

    futures = [rpc.rpc_async("worker1", ppkit.by_value(stuck)) for _ in range(3)]
    with pytest.raises(RuntimeError, match="timeout"):
        futures[0].wait()
    w.mark_broken()
    started = time.monotonic()
    w.close()
    assert time.monotonic() - started < 15
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
    again = ppkit.start_rpc(1)
    try:
        assert rpc.rpc_sync("worker1", torch.add, args=(2, 2)) == 4
    finally:
        again.close()


@pytest.mark.slow
def test_start_rpc_replaces_the_previous_world(no_leftovers):
    first = ppkit.start_rpc(1)
    second = ppkit.start_rpc(1)
    try:
        assert first.state == "closed"
        assert rpc.rpc_sync("worker1", torch.add, args=(1, 1)) == 2
    finally:
        second.close()
        second.close()  # idempotent


def test_bad_arguments_fail_before_starting():
    with pytest.raises(ppkit.ConfigError, match="at least 1"):
        ppkit.RpcWorld(0)
    with pytest.raises(ppkit.ConfigError, match="num_worker_threads"):
        ppkit.RpcWorld(1, num_worker_threads=0)
    with pytest.raises(ppkit.ConfigError, match="rpc_timeout"):
        ppkit.RpcWorld(1, rpc_timeout=-1)


def test_a_world_larger_than_the_first_is_refused_with_the_reason():
    # the session fixture made this process's first world with 2 workers
    with pytest.raises(ppkit.ClusterStateError, match=r"first RPC world had 2 worker\(s\).*restart the kernel"):
        ppkit.start_rpc(3)
