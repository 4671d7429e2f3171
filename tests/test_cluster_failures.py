"""How jobs fail: an exception on a rank, a rank that dies, a job that can never finish.

Every test ends with the cluster usable again (directly, or after the ``restart()`` the error asks
for), because that is what a learner does next.
"""

from __future__ import annotations

import inspect
import linecache
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from leftovers import pid_of, wait_gone

import ppkit
from ppkit.cluster.inbox import FORK_SERVER, Item
from ppkit.transport import procs
from ppkit.transport.messages import Exited

DIED_WITHIN_S = 5.0


def restart_gives_a_clean_world(cluster) -> None:
    old_pids = {w["pid"] for w in cluster.workers.values()}
    cluster.restart()
    assert cluster.state == "ready"
    assert not old_pids & {w["pid"] for w in cluster.workers.values()}

    def all_reduce_ones(rank, world_size):
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    assert cluster.run(all_reduce_ones) == [2.0, 2.0]


# -- an exception on a rank ------------------------------------------------------------------------
def test_exception_on_one_rank_names_the_rank_with_the_remote_traceback(fresh):
    def divide(rank, world_size):
        if rank == 1:
            return 1 / (rank - 1)
        return rank

    with pytest.raises(ppkit.RemoteError) as info:
        fresh.run(divide)
    err = info.value
    assert err.ranks == [1]
    assert err.exc_types == {1: "ZeroDivisionError"}
    assert str(err).startswith("rank 1 raised ZeroDivisionError: division by zero")
    assert "--- traceback on rank 1 ---" in str(err)
    assert "in divide" in err.tracebacks[1] and "return 1 / (rank - 1)" in err.tracebacks[1]
    assert isinstance(err, ppkit.WorkerError) and isinstance(err, ppkit.PPKitError)
    # nobody was left waiting, so the cluster goes on as before
    assert fresh.state == "ready"
    assert fresh.run(lambda rank, world_size: rank) == [0, 1]


def test_exception_on_every_rank_lists_them_all(fresh):
    class CellDefinedError(Exception):
        pass

    def fail(rank, world_size):
        raise CellDefinedError(f"bad input on rank {rank}")

    with pytest.raises(ppkit.RemoteError) as info:
        fresh.run(fail)
    assert info.value.ranks == [0, 1]
    assert "ranks [0, 1] raised" in str(info.value)
    assert "bad input on rank 0" in info.value.tracebacks[0]
    assert "bad input on rank 1" in info.value.tracebacks[1]
    assert fresh.state == "ready"


@pytest.mark.slow
def test_exception_while_another_rank_waits_for_it_says_so_and_restart_works(fresh):
    def one_raises_one_waits(rank, world_size):
        import torch
        import torch.distributed as dist

        if rank == 1:
            raise RuntimeError("rank 1 gave up before sending")
        dist.recv(torch.zeros(1), src=1)

    with pytest.raises(ppkit.RemoteError) as info:
        fresh.run(one_raises_one_waits)
    text = str(info.value)
    assert info.value.ranks == [1]
    assert "rank 1 raised RuntimeError: rank 1 gave up before sending" in text
    assert "Rank(s) [0] are still blocked" in text and "cluster.restart()" in text
    assert "--- rank 0 is waiting here ---" in text and "one_raises_one_waits" in text
    with pytest.raises(ppkit.ClusterStateError, match=r"restart\(\)"):
        fresh.run(lambda rank, world_size: rank)
    restart_gives_a_clean_world(fresh)


def test_a_return_value_that_cannot_be_pickled_is_explained(fresh):
    with pytest.raises(ppkit.RemoteError, match="cannot be pickled"):
        fresh.run(lambda rank, world_size: threading.Lock())
    assert fresh.run(lambda rank, world_size: rank) == [0, 1]


# -- a rank that dies ------------------------------------------------------------------------------
def _exit_code_3():
    os._exit(3)


def _sigsegv():
    os.kill(os.getpid(), signal.SIGSEGV)


def _null_pointer():
    import ctypes

    ctypes.string_at(0)


@pytest.mark.parametrize("die, how", [
    (_exit_code_3, "it exited with code 3"),
    (_sigsegv, "it was killed by signal SIGSEGV"),
    (_null_pointer, "it was killed by signal SIGSEGV"),
])
@pytest.mark.slow
def test_a_rank_that_dies_during_a_job_is_reported_within_5_s(fresh, die, how):
    def job(rank, world_size):
        if rank == 1:
            die()
        time.sleep(60)  # rank 0 would wait a long time: the error must not wait for it

    start = time.monotonic()
    with pytest.raises(ppkit.WorkerDiedError) as info:
        fresh.run(job)
    assert time.monotonic() - start < DIED_WITHIN_S
    assert info.value.ranks == [1]
    assert f"rank 1 (pid {fresh.workers[1]['pid']}) died during the job: {how}" in str(info.value)
    assert "cluster.restart()" in str(info.value)
    restart_gives_a_clean_world(fresh)


def test_a_rank_killed_from_outside_during_a_job_is_reported_within_5_s(fresh):
    victim = fresh.workers[1]["pid"]
    killed_at = []

    def kill_soon():
        time.sleep(1.0)
        killed_at.append(time.monotonic())
        os.kill(victim, signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    with pytest.raises(ppkit.WorkerDiedError, match="killed by signal SIGKILL") as info:
        fresh.run(lambda rank, world_size: time.sleep(60))
    killer.join()
    assert time.monotonic() - killed_at[0] < DIED_WITHIN_S
    assert info.value.ranks == [1]
    restart_gives_a_clean_world(fresh)


def test_a_rank_killed_between_jobs_is_reported_by_the_next_run(fresh):
    os.kill(fresh.workers[1]["pid"], signal.SIGKILL)
    time.sleep(0.5)
    start = time.monotonic()
    with pytest.raises(ppkit.ClusterStateError) as info:
        fresh.run(lambda rank, world_size: rank)
    assert time.monotonic() - start < DIED_WITHIN_S
    assert "rank 1" in str(info.value) and "SIGKILL" in str(info.value)
    assert "cluster.restart()" in str(info.value)
    restart_gives_a_clean_world(fresh)


# -- a job that can never finish -------------------------------------------------------------------
def test_the_default_job_timeout_is_at_most_60_s():
    assert inspect.signature(ppkit.Cluster).parameters["timeout"].default <= 60
    assert inspect.signature(ppkit.start).parameters.get("timeout") is None  # passed through **options


@pytest.mark.slow
def test_a_deadlock_times_out_naming_the_ranks_and_where_they_wait(fresh):
    def recv_with_no_send(rank, world_size):
        import torch
        import torch.distributed as dist

        dist.recv(torch.zeros(1), src=1 - rank)  # both ranks receive, nobody sends

    start = time.monotonic()
    with pytest.raises(ppkit.JobTimeoutError) as info:
        fresh.run(recv_with_no_send, timeout=3)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 3 + 5
    err = info.value
    assert err.ranks == [0, 1]
    assert isinstance(err, TimeoutError)
    assert "did not finish within 3 s: rank(s) [0, 1] are still waiting" in str(err)
    for rank in (0, 1):
        assert f"--- rank {rank} is waiting here ---" in str(err)
        assert "recv_with_no_send" in err.stacks[rank]
        assert "dist.recv(torch.zeros(1), src=1 - rank)" in err.stacks[rank]
    with pytest.raises(ppkit.ClusterStateError, match="timed out"):
        fresh.run(lambda rank, world_size: rank)
    restart_gives_a_clean_world(fresh)


@pytest.mark.slow
def test_one_rank_stuck_names_only_that_rank(fresh):
    def rank0_waits(rank, world_size):
        import torch
        import torch.distributed as dist

        if rank == 0:
            dist.recv(torch.zeros(1), src=1)
        return rank

    with pytest.raises(ppkit.JobTimeoutError) as info:
        fresh.run(rank0_waits, timeout=2)
    assert info.value.ranks == [0]
    assert "rank(s) [1] finished" in str(info.value)
    restart_gives_a_clean_world(fresh)


def test_a_late_exit_report_about_a_previous_worker_does_not_mislabel_the_new_one(fresh, monkeypatch):
    # restart() stops the old rank 1 politely (exit code 0); the fork server may report that only
    # once the new rank 1 is being started. Replay that ordering, then kill the new rank 1.
    old_pid = fresh.workers[1]["pid"]
    launcher = fresh._launcher
    spawn = launcher.spawn

    def spawn_then_report_old_exit():
        spawn()
        launcher.inbox.put(Item(FORK_SERVER, Exited(1, old_pid, 0)))

    monkeypatch.setattr(launcher, "spawn", spawn_then_report_old_exit)
    fresh.restart()
    monkeypatch.undo()
    threading.Timer(0.5, os.kill, (fresh.workers[1]["pid"], signal.SIGKILL)).start()
    with pytest.raises(ppkit.WorkerDiedError, match="killed by signal SIGKILL"):
        fresh.run(lambda rank, world_size: time.sleep(60))
    restart_gives_a_clean_world(fresh)


@pytest.mark.slow
def test_remote_tracebacks_and_stacks_show_the_lines_of_notebook_cells(fresh):
    # IPython keeps a cell's code only in linecache (mtime None), under a file name that does not
    # exist on disk; do the same here. The workers must still show the cell's lines.
    cell_name = "/tmp/ipykernel_0/not_on_disk_cell.py"
    source = ("def cell_fn(rank, world_size):\n"
              "    import torch, torch.distributed as dist\n"
              "    if rank == 1:\n"
              "        raise KeyError('the line of this raise must show')\n"
              "    dist.recv(torch.zeros(1), src=1)  # and so must this wait\n")
    linecache.cache[cell_name] = (len(source), None, source.splitlines(True), cell_name)
    namespace = {"__name__": "__main__"}
    exec(compile(source, cell_name, "exec"), namespace)  # noqa: S102 - what IPython does with a cell
    with pytest.raises(ppkit.RemoteError) as info:
        fresh.run(namespace["cell_fn"])
    assert "raise KeyError('the line of this raise must show')" in info.value.tracebacks[1]
    assert "dist.recv(torch.zeros(1), src=1)  # and so must this wait" in str(info.value)
    restart_gives_a_clean_world(fresh)


@pytest.mark.slow
def test_a_killed_fork_server_takes_its_workers_along_and_restart_brings_it_back(fresh):
    zygote = pid_of(fresh, "fork server")
    os.kill(zygote, signal.SIGKILL)
    assert wait_gone([w["pid"] for w in fresh.workers.values()], DIED_WITHIN_S) == []
    with pytest.raises(ppkit.ClusterStateError, match=f"the fork server \\(pid {zygote}\\) .* died"):
        fresh.run(lambda rank, world_size: rank)
    restart_gives_a_clean_world(fresh)
    assert pid_of(fresh, "fork server") != zygote


def test_a_dead_process_counts_as_exited_while_another_thread_waits_on_it():
    """Popen.poll() says None, without looking, while another thread is inside wait() on the same Popen (seen as
    the flaky fork-server test above: its fork server was a zombie and settle() did not wait for its close).
    procs.exited() looks at the process itself."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with proc._waitpid_lock:  # what a thread blocked in proc.wait() holds
        proc.kill()
        deadline = time.monotonic() + 5
        while procs.pid_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None  # the zombie is not seen ...
        assert procs.exited(proc)  # ... but it has exited
    proc.wait(5)
    assert procs.exited(proc)


@pytest.mark.slow
def test_a_fork_server_killed_during_a_job_is_reported_as_a_dead_rank(fresh):
    threading.Timer(0.5, os.kill, (pid_of(fresh, "fork server"), signal.SIGKILL)).start()
    with pytest.raises(ppkit.WorkerDiedError) as info:
        fresh.run(lambda rank, world_size: time.sleep(60))
    assert info.value.ranks in ([0], [1])
    restart_gives_a_clean_world(fresh)
