"""The spawn start method: every worker a fresh interpreter, no fork server, no PR_SET_PDEATHSIG.

This is how ppkit starts workers on macOS and Windows; here it runs on Linux so CI covers it: a
cluster's start, jobs, restart, a killed rank and close; the kernel killed; an RPC world; and a
tiny ``ppkit pipeline --verify``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from leftovers import wait_gone
from test_cluster_lifecycle import REPO, Kernel

import ppkit
from ppkit import compat
from ppkit.cluster import start_methods
from ppkit.cluster.launchers import spawn as spawn_launcher
from ppkit.cluster.start_methods import resolve_start_method

GONE_WITHIN_S = 5.0


# -- choosing the start method -----------------------------------------------------------------
def test_auto_picks_spawn_where_fork_is_unsafe_or_missing(monkeypatch):
    monkeypatch.delenv(start_methods.START_METHOD_ENV, raising=False)
    assert resolve_start_method("auto", platform="darwin") == "spawn"
    assert resolve_start_method("auto", platform="win32") == "spawn"
    assert resolve_start_method("auto", platform="linux") == "forkserver"
    assert resolve_start_method("spawn", platform="linux") == "spawn"


def test_the_environment_variable_forces_a_method_and_an_explicit_argument_wins(monkeypatch):
    monkeypatch.setenv(start_methods.START_METHOD_ENV, "spawn")
    assert resolve_start_method("auto", platform="linux") == "spawn"
    assert resolve_start_method("forkserver", platform="linux") == "forkserver"
    monkeypatch.setenv(start_methods.START_METHOD_ENV, "forkserver")
    assert resolve_start_method("auto", platform="darwin") == "forkserver"


def test_a_bad_start_method_is_refused_before_anything_starts(monkeypatch, no_leftovers):
    with pytest.raises(ppkit.ConfigError, match=r"unknown start_method 'fork'.*'auto', 'forkserver', 'spawn'"):
        ppkit.start(2, start_method="fork")
    with pytest.raises(ppkit.ConfigError, match="unknown start_method"):
        ppkit.start_rpc(2, start_method="vfork")
    monkeypatch.setenv(start_methods.START_METHOD_ENV, "threads")
    with pytest.raises(ppkit.ConfigError, match=r"unknown PPKIT_START_METHOD 'threads'.*'spawn'"):
        ppkit.Cluster(2, "gloo")


def test_spawn_is_refused_for_a_cluster_across_machines():
    with pytest.raises(ppkit.ConfigError, match="start_method='forkserver'"):
        ppkit.Cluster(2, listen="127.0.0.1:0", remote=["worker1"], start_method="spawn")


# -- a cluster of fresh interpreters ---------------------------------------------------------------
# (tests below check their own processes are gone: this module's cluster runs until the module ends)
@pytest.fixture(scope="module")
def spawned():
    with ppkit.Cluster(2, "gloo", timeout=30, start_method="spawn") as cluster:
        yield cluster


def test_each_rank_is_a_fresh_interpreter_started_by_the_kernel(spawned):
    assert "launcher='spawn'" in repr(spawned)
    assert "fork server" not in [p.role for p in spawned.processes()]
    for worker in spawned.workers.values():
        proc = psutil.Process(worker["pid"])
        assert proc.ppid() == os.getpid()  # no fork server in between
        assert "ppkit.transport.fresh" in " ".join(proc.cmdline())
        assert os.getsid(proc.pid) != os.getsid(0)  # Kernel > Interrupt does not reach it


def test_jobs_and_collectives_run_in_spawn_mode(spawned):
    def all_reduce(rank, world_size):
        import torch
        import torch.distributed as dist

        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        return t.item()

    assert spawned.run(all_reduce) == [3.0, 3.0]


@pytest.mark.slow
def test_a_killed_rank_is_reported_with_its_signal_then_restart_replaces_every_worker(spawned):
    old = [w["pid"] for w in spawned.workers.values()]

    def die(rank, world_size):
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)

    with pytest.raises(ppkit.WorkerDiedError, match="killed by signal SIGKILL"):
        spawned.run(die)
    spawned.restart()
    assert wait_gone(old, GONE_WITHIN_S) == []
    assert spawned.run(lambda rank, world_size: rank) == [0, 1]


def test_processes_lists_each_spawned_worker_once_by_rank(spawned):
    # after the restart above too: the spawn launcher's own processes are the workers themselves
    found = spawned.processes()
    pids = [p.pid for p in found]
    assert len(pids) == len(set(pids)) == 2, found
    assert sorted(p.rank for p in found) == [0, 1]
    assert sorted(pids) == sorted(w["pid"] for w in spawned.workers.values())


@pytest.mark.slow
def test_close_leaves_no_process():
    cluster = ppkit.start(2, "gloo", start_method="spawn")
    pids = [w["pid"] for w in cluster.workers.values()]
    cluster.close()
    assert wait_gone(pids, GONE_WITHIN_S) == []


def test_a_worker_that_dies_before_connecting_fails_the_start_at_once_with_its_output(monkeypatch):
    monkeypatch.setattr(spawn_launcher, "WORKER_MODULE", "ppkit.transport.no_such_module")
    # the exit is noticed and its output shown (a start_timeout would say "did not start within")
    with pytest.raises(ppkit.LaunchError, match=r"(?s)exited before it connected.*No module named"):
        ppkit.Cluster(2, "gloo", start_method="spawn", start_timeout=60)


# -- orphans: the parent watch, without PR_SET_PDEATHSIG ---------------------------------------------
def test_the_parent_watch_alone_ends_an_orphan():
    # a middle process starts a child that only watches it, then the middle one is SIGKILLed
    script = textwrap.dedent("""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c",
            "import os, time; from ppkit.transport import procs; procs.watch_parent(os.getppid()); "
            "print('watching', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
        print(child.pid, flush=True)
        time.sleep(60)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    middle = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    child = int(middle.stdout.readline())
    assert psutil.pid_exists(child)
    middle.kill()
    middle.wait()
    assert wait_gone([child], GONE_WITHIN_S) == [], "the child outlived its parent"


KERNEL_WITH_SPAWNED_CLUSTER = """
    import json, sys
    import ppkit
    cluster = ppkit.start(2, "gloo", start_method="spawn")
    print("PIDS", json.dumps([w["pid"] for w in cluster.workers.values()]))
    sys.stdin.read()
"""


@pytest.mark.slow
def test_no_spawned_worker_survives_a_killed_kernel():
    with Kernel(KERNEL_WITH_SPAWNED_CLUSTER) as kernel:
        lines = kernel.read_until(lambda lines: lines[-1].startswith("PIDS "))
        pids = json.loads(lines[-1].split(" ", 1)[1])
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.proc.wait(timeout=30)
    assert wait_gone(pids, GONE_WITHIN_S) == [], "spawned workers outlived the kernel"


# -- RPC -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_an_rpc_world_runs_on_spawned_workers():
    import torch
    import torch.distributed.rpc as rpc

    with ppkit.start_rpc(2, start_method="spawn") as world:
        assert "launcher='spawn'" in repr(world.cluster)
        assert "fork server" not in [p.role for p in world.cluster.processes()]
        assert rpc.rpc_sync("worker2", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]
        pids = [w["pid"] for w in world.cluster.workers.values()]
    assert wait_gone(pids, GONE_WITHIN_S) == []


def test_the_rpc_lessons_say_why_they_cannot_run_where_torch_has_no_rpc(monkeypatch):
    import torch.distributed.rpc as rpc

    with pytest.raises(ppkit.ClusterStateError, match=r"notebooks 04 .*06.*not built for Windows"):
        compat.require_rpc_platform("win32")
    monkeypatch.setattr(rpc, "is_available", lambda: False)
    with pytest.raises(ppkit.ClusterStateError, match=r"notebooks 04 .*built without torch.distributed.rpc"):
        ppkit.start_rpc(2)


# -- the pipeline --------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_tiny_pipeline_verifies_in_spawn_mode():
    env = {**os.environ, start_methods.START_METHOD_ENV: "spawn",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "ppkit", "pipeline", "--batch-size", "8", "--image-size", "32",
         "--num-batches", "1", "--microbatch-sizes", "4", "--verify"],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify:" in done.stdout, done.stdout
