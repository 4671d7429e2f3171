"""The cluster as the operating system sees it: who may connect, what listens where, idle cost."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import time

import psutil
import pytest
from leftovers import pid_of

import ppkit
from ppkit.transport import channel, worker
from ppkit.transport.messages import Hello, Reject, WorkerHello

IDLE_SECONDS = 5.0
IDLE_CPU_FRACTION = 0.02  # of one core, per process


class _CreatesFileWhenUnpickled:
    """A payload that would leave a marker file if the controller ever unpickled it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def ppkit_pids(cluster) -> list[int]:
    return [os.getpid(), pid_of(cluster, "fork server")] + [w["pid"] for w in cluster.workers.values()]


def all_reduce_ones(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


# -- authentication --------------------------------------------------------------------------------
def test_a_client_with_the_wrong_key_is_refused_and_runs_nothing(cluster2):
    workers_before = dict(cluster2.workers)
    conns_before = dict(cluster2._conns)
    wrong_key = bytes(b ^ 0xFF for b in cluster2._key)
    with pytest.raises(ppkit.AuthenticationError, match="refused this client's key") as info:
        channel.connect(cluster2.address, wrong_key, timeout=10)
    assert "PPKIT_KEY" in str(info.value)
    assert cluster2._conns == conns_before and cluster2.workers == workers_before
    assert cluster2.run(all_reduce_ones) == [2.0, 2.0]


def test_a_client_that_skips_the_handshake_gets_nothing_unpickled(cluster2, tmp_path):
    marker = tmp_path / "unpickled"
    frame = pickle.dumps(("hello", _CreatesFileWhenUnpickled(str(marker))))
    with socket.create_connection(cluster2.address, timeout=10) as sock:
        sock.sendall(struct.pack("!i", len(frame)) + frame)  # multiprocessing.connection framing
        sock.settimeout(10)
        try:
            while sock.recv(4096):  # the controller answers the challenge failure, then closes
                pass
        except ConnectionResetError:
            pass
    time.sleep(0.5)
    assert not marker.exists()
    assert cluster2.run(lambda rank, world_size: rank) == [0, 1]


def test_a_client_with_the_key_but_a_rank_outside_the_world_is_rejected(cluster2):
    conn = channel.connect(cluster2.address, cluster2._key)
    try:
        conn.send(Hello(WorkerHello(rank=7, name=None, pid=os.getpid(), host="here", versions=worker.versions())))
        reply = conn.recv()
    finally:
        conn.close()
    assert isinstance(reply, Reject) and "ranks 0..1, not 7" in reply.reason
    assert cluster2.run(lambda rank, world_size: rank) == [0, 1]


# -- sockets ---------------------------------------------------------------------------------------
def test_every_socket_ppkit_opens_listens_on_loopback_only(cluster2):
    assert cluster2.run(all_reduce_ones) == [2.0, 2.0]  # gloo's connections are all open now
    listening = []
    for pid in ppkit_pids(cluster2):
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                listening.append((pid, conn.laddr.ip, conn.laddr.port))
    assert (os.getpid(), "127.0.0.1", cluster2.address[1]) in listening  # the control channel
    assert [entry for entry in listening if entry[1] != "127.0.0.1"] == []


def test_workers_talk_to_each_other_over_loopback_only(cluster2):
    assert cluster2.run(all_reduce_ones) == [2.0, 2.0]
    for pid in ppkit_pids(cluster2)[1:]:
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            assert conn.laddr.ip == "127.0.0.1", (pid, conn)
            if conn.raddr:
                assert conn.raddr.ip == "127.0.0.1", (pid, conn)


# -- idle cost -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_idle_workers_cost_almost_no_cpu(cluster2):
    assert cluster2.run(all_reduce_ones) == [2.0, 2.0]
    time.sleep(0.5)  # let the job's last output settle
    procs = [psutil.Process(pid) for pid in ppkit_pids(cluster2)[1:]]
    before = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(IDLE_SECONDS)
    after = [sum(p.cpu_times()[:2]) for p in procs]
    used = {p.pid: round((a - b) / IDLE_SECONDS, 4) for p, a, b in zip(procs, after, before)}
    assert all(fraction < IDLE_CPU_FRACTION for fraction in used.values()), used


def _oom_score_adj(pid: int) -> int:
    with open(f"/proc/{pid}/oom_score_adj") as f:
        return int(f.read())


@pytest.mark.skipif(not os.path.exists("/proc/self/oom_score_adj"), reason="no /proc/PID/oom_score_adj (not Linux)")
def test_workers_are_the_first_the_oom_killer_takes(cluster2):
    """Out of memory, the kernel's OOM killer must take a worker (whose end ppkit explains), not the notebook
    kernel or the fork server that reports the workers' exit statuses: only the workers raise their score."""
    from ppkit.transport.procs import WORKER_OOM_SCORE_ADJ

    ranks = [p for p in cluster2.processes() if p.rank is not None]
    assert len(ranks) == 2 and all(_oom_score_adj(p.pid) == WORKER_OOM_SCORE_ADJ for p in ranks), ranks
    mine = _oom_score_adj(os.getpid())
    assert mine < WORKER_OOM_SCORE_ADJ and _oom_score_adj(pid_of(cluster2, "fork server")) == mine
