"""The spare fork server (ppkit/cluster/launchers/spare.py): a closed cluster's fork server, parked, used by the next
cluster that would start the same process, never by one that would not, and gone by itself when unused or with its
kernel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
from leftovers import wait_gone

import ppkit
from ppkit.cluster.launchers import spare

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture(autouse=True)
def _no_spare_before_and_after():
    spare.discard()
    yield
    spare.discard()


def _spare_after_a_cluster() -> int:
    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        assert cluster.run(lambda rank, world_size: rank) == [0, 1]
        server = cluster._launcher.fork_server_pid
        workers = [w["pid"] for w in cluster.workers.values()]
    assert spare.pid() == server, "a closed cluster's fork server waits for the next cluster"
    assert wait_gone(workers, 5.0) == []  # its workers were stopped
    assert psutil.Process(server).net_connections("all") == []  # nothing open while it waits
    return server


def test_the_next_cluster_forks_from_the_spare_and_runs(tmp_path):
    waiting = _spare_after_a_cluster()
    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        assert cluster._launcher.fork_server_pid == waiting
        assert spare.pid() is None  # taken: none waits while it serves
        assert {w["pid"] for w in cluster.workers.values()} <= {c.pid for c in psutil.Process(waiting).children()}
        assert cluster.run(lambda rank, world_size: print(f"hello from {rank}") or rank * 10) == [0, 10]
        cluster.restart()  # keeps the fork server, as with one started for it
        assert cluster._launcher.fork_server_pid == waiting
        assert cluster.run(lambda rank, world_size: rank) == [0, 1]
        log = cluster._launcher.log_path
        assert log.parent == cluster._launcher.tmpdir and log.is_file()  # it writes to this cluster's log now
    assert spare.pid() == waiting  # parked again
    with ppkit.Cluster(3, "gloo", timeout=30) as cluster:  # and taken again, for another world size
        assert cluster._launcher.fork_server_pid == waiting
        assert cluster.run(lambda rank, world_size: world_size) == [3, 3, 3]


@pytest.mark.slow
def test_a_changed_environment_gets_a_fresh_fork_server(monkeypatch):
    waiting = _spare_after_a_cluster()
    monkeypatch.setenv("PPKIT_TEST_SPARE_MARK", "set after the spare started")  # e.g. GLOO_SOCKET_IFNAME
    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        server = cluster._launcher.fork_server_pid
        assert server != waiting
        assert psutil.Process(server).environ()["PPKIT_TEST_SPARE_MARK"] == "set after the spare started"
        assert wait_gone([waiting], 5.0, spare_too=True) == []  # the spare that did not fit was stopped


@pytest.mark.slow
def test_a_changed_working_directory_gets_a_fresh_fork_server(tmp_path, monkeypatch):
    waiting = _spare_after_a_cluster()
    monkeypatch.chdir(tmp_path)
    with ppkit.Cluster(1, "gloo", timeout=30) as cluster:
        assert cluster._launcher.fork_server_pid != waiting
        assert cluster.run(lambda rank, world_size: os.getcwd()) == [str(tmp_path)]


def test_spares_off(monkeypatch):
    monkeypatch.setenv(spare.SPARE_S_ENV, "0")
    with ppkit.Cluster(1, "gloo", timeout=30) as cluster:
        server = cluster._launcher.fork_server_pid
    assert spare.pid() is None and wait_gone([server], 5.0, spare_too=True) == []


@pytest.mark.slow
def test_an_unused_spare_leaves_by_itself(monkeypatch):
    monkeypatch.setenv(spare.SPARE_S_ENV, "1")
    with ppkit.Cluster(1, "gloo", timeout=30) as cluster:
        server = cluster._launcher.fork_server_pid
    assert spare.pid() == server
    assert wait_gone([server], 10.0, spare_too=True) == []
    monkeypatch.delenv(spare.SPARE_S_ENV)
    with ppkit.Cluster(1, "gloo", timeout=30) as cluster:  # starts a fresh fork server, with no complaint
        assert cluster._launcher.fork_server_pid != server
        assert cluster.run(lambda rank, world_size: rank) == [0]


def test_a_worker_reads_no_stdin():
    with ppkit.Cluster(1, "gloo", timeout=30) as cluster:  # stdin is the kernel's pipe to the fork server, not theirs
        assert cluster.run(lambda rank, world_size: __import__("sys").stdin.read()) == [""]


KERNEL = textwrap.dedent("""
    import ppkit, sys
    from ppkit.cluster.launchers import spare
    with ppkit.Cluster(1, "gloo", timeout=30) as cluster:
        cluster.run(lambda rank, world_size: rank)
    print(spare.pid(), flush=True)
    sys.stdin.read()
""")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exits", "is killed"])
def test_a_spare_ends_with_its_kernel(how):
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        waiting = int(kernel.stdout.readline())
        assert psutil.pid_exists(waiting)
        if how == "exits":
            kernel.stdin.close()
        else:
            kernel.send_signal(signal.SIGKILL)
        kernel.wait(timeout=30)
        assert wait_gone([waiting], 10.0, spare_too=True) == [], f"the spare outlived a kernel that {how}"
    finally:
        kernel.kill()
        kernel.wait()
