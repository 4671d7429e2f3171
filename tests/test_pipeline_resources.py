"""Stage resources: the plan (pure), then real worker processes pinned and threaded (psutil), and
the master put back when the world restarts or closes."""

from __future__ import annotations

import os
import sys

import psutil
import pytest
import torch
import torch.distributed.rpc as rpc

import ppkit
from ppkit.pipeline.rpc import resources
from ppkit.pipeline.rpc.config import PipelineConfig, parse_placement
from ppkit.pipeline.rpc.resources import check_stage_threads, describe, plan
from ppkit.pipeline.rpc.sweep import build_model


def reports(cpus, **hosts):
    names = ("master", "worker1", "worker2", "worker3")
    return {n: {"host": hosts.get(n, "a"), "pid": 1, "cpus": tuple(cpus), "threads": len(cpus)} for n in names}


def by_process(plans):
    return {p.process: p for p in plans}


def test_two_cores_two_stage_workers_one_core_each_and_a_light_master():
    plans = by_process(plan(parse_placement("worker1:cpu,worker2:cpu"), "auto", reports([0, 1])))
    assert (plans["worker1"].threads, plans["worker1"].cpus) == (1, (0,))
    assert (plans["worker2"].threads, plans["worker2"].cpus) == (1, (1,))
    assert (plans["master"].threads, plans["master"].cpus) == (1, None)  # no core left over
    text = describe(plans.values())
    assert "stage 1 on worker1: 1 thread, core 0" in text and "stage 2 on worker2: 1 thread, core 1" in text
    assert "no core left over" in text


def test_cores_left_over_go_to_the_master_and_shares_are_contiguous():
    plans = by_process(plan(parse_placement("worker1:cpu,worker2:cpu"), "auto", reports(range(5))))
    assert plans["worker1"].cpus == (0, 1, 2) and plans["worker1"].threads == 3
    assert plans["worker2"].cpus == (3, 4) and plans["worker2"].threads == 2
    assert plans["master"].cpus is None  # 5 cores, 2 stages: all given to the stages
    assert "cores 0-2" in plans["worker1"].describe()


def test_master_with_a_shard_and_both_shards_on_one_process():
    plans = by_process(plan(parse_placement("master:cpu,worker1:cpu"), "auto", reports([0, 1])))
    assert plans["master"].cpus == (0,) and plans["master"].stages == (0,)
    assert plans["worker1"].cpus == (1,)
    plans = by_process(plan(parse_placement("worker1:cpu,worker1:cpu"), "auto", reports([0, 1])))
    assert plans["worker1"].cpus == (0, 1) and plans["worker1"].stages == (0, 1)
    assert "stage 1+2 on worker1: 2 threads, cores 0-1" in plans["worker1"].describe()


def test_gpu_stages_off_numbers_and_other_hosts():
    plans = by_process(plan(parse_placement("worker1:cuda:0,worker2:cpu"), "auto", reports([0, 1])))
    assert plans["worker1"].threads is None and "device is its resource" in plans["worker1"].describe()
    assert plans["worker2"].cpus == (0, 1)
    plans = by_process(plan(parse_placement("worker1:cpu,worker2:cpu"), "off", reports([0, 1])))
    assert all(p.threads is None and p.cpus is None for p in plans.values()) and "master" not in plans
    plans = by_process(plan(parse_placement("worker1:cpu,worker2:cpu"), 3, reports([0, 1])))
    assert plans["worker1"].threads == 3 and plans["worker1"].cpus is None
    # worker2 on another machine: each host's cores are split between the stages on that host
    plans = by_process(plan(parse_placement("worker1:cpu,worker2:cpu"), "auto",
                            reports([0, 1, 2, 3], worker2="b")))
    assert plans["worker1"].cpus == (0, 1, 2, 3) and plans["worker2"].cpus == (0, 1, 2, 3)
    # more stage processes than cores: one thread each, no pinning
    plans = by_process(plan(parse_placement("worker1:cpu,worker2:cpu"), "auto", reports([0])))
    assert plans["worker1"].threads == 1 and plans["worker1"].cpus is None


@pytest.mark.parametrize("bad", [0, -1, "two", 1.5, True])
def test_bad_stage_threads_are_refused(bad):
    with pytest.raises(ppkit.ConfigError, match="stage threads"):
        check_stage_threads(bad)
    with pytest.raises(ppkit.ConfigError, match="stage threads"):
        PipelineConfig(stage_threads=bad).check()
    assert check_stage_threads("AUTO") == "auto" and check_stage_threads("4") == 4


def _thread_affinities(pid):
    """The CPU sets of a process's threads; a thread that ends between listing and asking is left out
    (seen in CI: a short-lived helper thread of the test process was gone by the time it was asked)."""
    sets = set()
    for thread in psutil.Process(pid).threads():
        try:
            sets.add(frozenset(os.sched_getaffinity(thread.id)))
        except ProcessLookupError:
            continue
    return sets


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="CPU affinity needs Linux and at least 2 usable cores")
@pytest.mark.slow
def test_real_workers_are_pinned_and_the_master_restored(no_leftovers):
    cpus = sorted(os.sched_getaffinity(0))
    threads_before = torch.get_num_threads()
    config = PipelineConfig(batch_size=2, image_size=40, num_batches=1, microbatch_sizes=(1,),
                            placement="master:cpu,worker1:cpu", cut="layer1").check()
    world = ppkit.start_rpc(1)
    try:
        model, _ = build_model(config)
        got = {p.process: p for p in model.resources}
        half = len(cpus) // 2 + len(cpus) % 2
        assert got["master"].cpus == tuple(cpus[:half]) and got["worker1"].cpus == tuple(cpus[half:])
        worker_pid = rpc.rpc_sync("worker1", resources.current)["pid"]
        # every thread of the worker (RPC threads, the stage's compute thread, ...) is pinned
        assert _thread_affinities(worker_pid) == {frozenset(cpus[half:])}
        assert psutil.Process(worker_pid).cpu_affinity() == cpus[half:]
        assert rpc.rpc_sync("worker1", resources.current)["threads"] == len(cpus) - half
        assert psutil.Process().cpu_affinity() == cpus[:half] and torch.get_num_threads() == half
        model.close()
        world.restart()  # a fresh world: the master is itself again
        assert psutil.Process().cpu_affinity() == cpus and torch.get_num_threads() == threads_before
        model, _ = build_model(config)
        assert psutil.Process().cpu_affinity() == cpus[:half]
        model.close()
    finally:
        world.close()
    assert psutil.Process().cpu_affinity() == cpus and torch.get_num_threads() == threads_before
    assert _thread_affinities(os.getpid()) == {frozenset(cpus)}
