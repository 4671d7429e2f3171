"""Starting, replacing, closing and losing clusters: no worker may outlive what owns it.

Several tests drive a second Python process, standing in for the notebook kernel, so that they
can kill it or interrupt it the way Jupyter does (Kernel > Interrupt sends SIGINT to the kernel's
process group).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from leftovers import pid_of, wait_gone

import ppkit
from ppkit.cluster import session

REPO = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 5.0


def all_pids(cluster) -> list[int]:
    return [w["pid"] for w in cluster.workers.values()] + [pid_of(cluster, "fork server")]


class Kernel:
    """A stand-in notebook kernel running ``script`` in its own process group.

    A thread reads its output line by line (``select`` on a buffered pipe can miss lines that
    arrived together), so tests can wait for a line without blocking.
    """

    def __init__(self, script: str, *args: str):
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", textwrap.dedent(script), *args], cwd=REPO, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def read_until(self, predicate, timeout: float = 90.0) -> list[str]:
        """All lines so far, once ``predicate(lines)`` holds; fail if the kernel never gets there."""
        deadline = time.monotonic() + timeout
        while not (self.lines and predicate(self.lines)):
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.proc.kill()
                raise AssertionError("the kernel process did not get there; it printed:\n"
                                     + "\n".join(self.lines))
            self.lines.append(line)
        return self.lines

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


# -- start, replace, close -------------------------------------------------------------------------
@pytest.mark.slow
def test_running_the_start_cell_again_replaces_the_cluster(no_leftovers):
    first = ppkit.start(2, "gloo")
    first_pids = all_pids(first)
    try:
        second = ppkit.start(2, "gloo")  # the learner re-runs the cell
        assert first.state == "closed"
        handed_on = second._launcher.fork_server_pid  # the first's, parked and taken (ppkit/cluster/launchers/spare.py)
        assert handed_on in first_pids
        assert wait_gone([pid for pid in first_pids if pid != handed_on], GONE_WITHIN_S) == []
        assert session.active() is second
        assert second.run(lambda rank, world_size: rank) == [0, 1]
        with pytest.raises(ppkit.ClusterStateError, match=r"closed.*ppkit\.start"):
            first.run(lambda rank, world_size: rank)
    finally:
        session.active() and session.active().close()
    assert session.active() is None


@pytest.mark.slow
def test_close_is_idempotent_and_a_closed_cluster_says_so(no_leftovers):
    cluster = ppkit.Cluster(2, "gloo")
    pids = all_pids(cluster)
    cluster.close()
    assert cluster.state == "closed"
    assert wait_gone(pids, GONE_WITHIN_S) == []
    cluster.close()  # twice is fine
    assert cluster.state == "closed"
    with pytest.raises(ppkit.ClusterStateError, match="closed"):
        cluster.run(lambda rank, world_size: rank)
    with pytest.raises(ppkit.ClusterStateError, match="closed"):
        cluster.restart()


@pytest.mark.slow
def test_leaving_a_with_block_closes_even_on_error(no_leftovers):
    with pytest.raises(RuntimeError, match="the cell failed"), ppkit.Cluster(2, "gloo") as cluster:
        pids = all_pids(cluster)
        raise RuntimeError("the cell failed")
    assert cluster.state == "closed"
    assert wait_gone(pids, GONE_WITHIN_S) == []


@pytest.mark.slow
def test_restart_replaces_every_worker_but_keeps_the_fork_server(no_leftovers):
    with ppkit.Cluster(2, "gloo") as cluster:
        old_workers = [w["pid"] for w in cluster.workers.values()]
        zygote = pid_of(cluster, "fork server")
        cluster.restart()
        assert wait_gone(old_workers, GONE_WITHIN_S) == []
        assert pid_of(cluster, "fork server") == zygote
        assert cluster.run(lambda rank, world_size: rank) == [0, 1]


# -- the kernel goes away --------------------------------------------------------------------------
KERNEL_WITH_CLUSTER = """
    import json, sys
    import ppkit
    cluster = ppkit.start(2, "gloo")
    print("PIDS", json.dumps([p.pid for p in cluster.processes()]))  # the fork server and the workers
    sys.stdin.read()  # wait until the test closes stdin (or kills us)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "exit without close()"])
def test_no_worker_survives_the_kernel(no_leftovers, how):
    with Kernel(KERNEL_WITH_CLUSTER) as kernel:
        lines = kernel.read_until(lambda lines: lines[-1].startswith("PIDS "))
        pids = json.loads(lines[-1].split(" ", 1)[1])
        assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
        if how == "exit without close()":
            kernel.proc.stdin.close()
        else:
            os.kill(kernel.pid, getattr(signal, how))
        kernel.proc.wait(timeout=30)
    assert wait_gone(pids, GONE_WITHIN_S) == [], f"ppkit processes outlived the kernel ({how})"


@pytest.mark.slow
def test_workers_are_in_their_own_session(no_leftovers):
    # so that Kernel > Interrupt (SIGINT to the kernel's process group) never reaches them
    with ppkit.Cluster(2, "gloo") as cluster:
        for pid in all_pids(cluster):
            assert os.getsid(pid) != os.getsid(0)
            assert os.getpgid(pid) != os.getpgid(0)


# -- Kernel > Interrupt ----------------------------------------------------------------------------
KERNEL_INTERRUPTED = """
    import json, sys, time
    import ppkit

    def python_loop(rank, world_size):
        print("started", flush=True)
        while True:
            sum(range(1000))

    def blocked_in_cxx(rank, world_size):
        import torch
        import torch.distributed as dist
        print("started", flush=True)
        dist.recv(torch.zeros(1), src=1 - rank)  # nobody sends: stuck inside gloo

    cluster = ppkit.start(2, "gloo")
    try:
        cluster.run(python_loop if sys.argv[1] == "python" else blocked_in_cxx)
        print("NOT INTERRUPTED")
    except ppkit.JobInterrupted as exc:
        print("INTERRUPTED", json.dumps({"at": time.time(), "message": str(exc), "state": cluster.state}))
    if cluster.state == "broken":
        cluster.restart()
    print("AFTER", json.dumps(cluster.run(lambda rank, world_size: rank)))
    cluster.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize("job", ["python", "cxx"])
def test_interrupt_during_run_returns_promptly_and_leaves_a_usable_cluster(no_leftovers, job):
    with Kernel(KERNEL_INTERRUPTED, job) as kernel:
        kernel.read_until(lambda lines: sum(line.endswith("] started") for line in lines) == 2)
        if job == "cxx":
            time.sleep(1.0)  # "started" comes just before recv: let both ranks get into gloo
        interrupted_at = time.time()
        os.killpg(kernel.pid, signal.SIGINT)  # what Kernel > Interrupt does
        lines = kernel.read_until(lambda lines: lines[-1].startswith("AFTER "))
        assert kernel.proc.wait(timeout=30) == 0
    report = json.loads(next(line for line in lines if line.startswith("INTERRUPTED ")).split(" ", 1)[1])
    assert report["at"] - interrupted_at < 5.0
    if job == "python":  # cancelled inside Python: the same workers go on
        assert "cancelled on every rank; the cluster is ready to use" in report["message"]
        assert report["state"] == "ready"
    else:  # a rank blocked in C++ cannot be cancelled: say so, and restart() must work
        # normally both ranks; on a loaded machine one may still have been in Python (cancelled)
        stuck = re.search(r"rank\(s\) \[([0-9, ]+)\] could not be stopped", report["message"])
        assert stuck and set(map(int, stuck.group(1).split(","))) <= {0, 1}, report["message"]
        assert "cluster.restart()" in report["message"]
        assert f"--- rank {stuck.group(1)[0]} is waiting here ---" in report["message"]
        assert report["state"] == "broken"
    assert lines[-1] == "AFTER [0, 1]"


# -- two clusters at once --------------------------------------------------------------------------
SECOND_LEARNER = """
    import ppkit

    def all_reduce_rank_plus_one(rank, world_size):
        import torch
        import torch.distributed as dist
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        return t.item()

    with ppkit.Cluster(3, "gloo") as cluster:
        print("READY", flush=True)
        sums = {s for _ in range(200) for s in cluster.run(all_reduce_rank_plus_one)}
        print("SUMS", sorted(sums))
"""


@pytest.mark.slow
def test_two_clusters_at_once_never_clash(no_leftovers):
    def all_reduce_rank_plus_one(rank, world_size):
        import torch
        import torch.distributed as dist

        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        return t.item()

    # another notebook kernel on the same machine, plus two clusters in this one
    with Kernel(SECOND_LEARNER) as other_learner:
        with ppkit.Cluster(2, "gloo") as mine, ppkit.Cluster(4, "gloo") as also_mine:
            assert mine.address != also_mine.address
            other_learner.read_until(lambda lines: lines[-1] == "READY")
            sums: dict[int, set] = {2: set(), 4: set()}

            def hammer(cluster):
                for _ in range(100):
                    sums[cluster.world_size].update(cluster.run(all_reduce_rank_plus_one))

            threads = [threading.Thread(target=hammer, args=(c,)) for c in (mine, also_mine)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert sums == {2: {3.0}, 4: {10.0}}
        lines = other_learner.read_until(lambda lines: lines[-1].startswith("SUMS"))
        assert lines[-1] == "SUMS [6.0]"
        assert other_learner.proc.wait(timeout=30) == 0


@pytest.mark.slow
def test_starting_a_gloo_cluster_does_not_import_torch_in_the_kernel(no_leftovers):
    # Start-up time: the fork server imports torch for the workers; if the kernel imported it too
    # (directly, or by unpickling a torch object a worker sent), a fresh kernel would wait twice.
    script = """
        import sys
        import ppkit
        with ppkit.Cluster(2, "gloo") as cluster:
            print("RESULT", cluster.run(lambda rank, world_size: rank), "torch" in sys.modules)
    """
    with Kernel(script) as kernel:
        lines = kernel.read_until(lambda lines: lines[-1].startswith("RESULT"))
    assert lines[-1] == "RESULT [0, 1] False"
