"""Peers that go silent without closing anything: a frozen (SIGSTOPped) machine or process, a
killed master, a network link that goes down. Each must end within a bound, with an error that
says which machine stopped answering, and leave no process behind.

The two-machine tests run the master and ``ppkit worker`` in two network namespaces joined by a
veth pair (tests/netns.py; they skip where namespaces cannot be made). Every fault is injected
while both ranks are blocked in ``dist.recv`` waiting for each other, as a real job would be.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import netns
import pytest
from leftovers import wait_gone
from netns import PY, Lines, host_env

import ppkit
from ppkit.errors import JobTimeoutError, LaunchError
from ppkit.transport import channel, heartbeat, worker
from ppkit.transport.messages import Admitted, AgentHello, AgentInfo, Spawn

two_hosts = netns.two_hosts  # the fixture

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # slow: make test-fast leaves it out
PORT = 29600
SLACK_S = 6.0  # a loaded two-core machine (torch imports, gloo) is late by this much at most
# Every process here gives a silent peer up after 5 s instead of 12 (heartbeats every 0.8 s instead of 2): the
# same behaviour, shown in less time. tests/test_heartbeat.py checks the default and the variable.
SILENT_S = 5.0
BOUND_S = SILENT_S + SLACK_S


def env(key: str) -> dict:
    return host_env(key, **{heartbeat.SILENT_ENV: f"{SILENT_S:g}"})

BLOCKED_JOB = """
import sys, time, ppkit
def job(rank, world_size):
    import torch, torch.distributed as dist
    print("job started", flush=True)
    dist.recv(torch.zeros(1), src=1 - rank)  # each rank waits for the other: blocked in recv
with ppkit.Cluster(2, listen=sys.argv[1], remote=["worker1"], start_timeout=60, timeout=120) as c:
    try:
        c.run(job)
    except ppkit.PPKitError as exc:
        print(f"FAILED {type(exc).__name__}: " + " ".join(str(exc).split()), flush=True)
print("master done", flush=True)
"""


def pids_in(namespace: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def start_both(hosts, key: str) -> tuple[Lines, Lines]:
    """``ppkit worker`` on the worker host, the blocked job on the master; both ranks in their recv."""
    argv = [PY, "-m", "ppkit", "worker", "--connect", f"{hosts.master.address}:{PORT}", "--name", "worker1",
            "--timeout", "60"]
    agent = Lines(hosts.popen(hosts.worker, argv, env=env(key), stdout=-1, stderr=-2, text=True))
    master = Lines(hosts.popen(hosts.master, [PY, "-c", BLOCKED_JOB, f"{hosts.master.address}:{PORT}"],
                               env=env(key), stdout=-1, stderr=-2, text=True))
    master.wait_for(r"\[rank 1\] job started", 120)
    time.sleep(0.5)  # rank 0 in its recv too
    return agent, master


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def test_a_frozen_worker_machine_fails_the_job_naming_it(two_hosts, no_leftovers):
    agent, master = start_both(two_hosts, os.urandom(32).hex())
    frozen = pids_in(two_hosts.worker.netns)  # the agent and its rank: the whole machine stops
    signal_all(frozen, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        failed = master.wait_for(r"^FAILED (\w+): (.*)$", BOUND_S + 10)
        when = master.when
        master.wait_for(r"^master done", 30)
    finally:
        signal_all(frozen, signal.SIGCONT)
    took = when - stopped
    print(f"the master gave the frozen machine up after {took:.1f} s: {failed.group(2)[:160]}")
    assert failed.group(1) == "WorkerDiedError"
    assert "rank 1 is lost during the job: worker1 on hostb stopped answering" in failed.group(2)
    assert "GLOO_SOCKET_IFNAME" not in failed.group(2) and "send without" not in failed.group(2)
    assert took < BOUND_S
    assert master.proc.wait(timeout=30) == 0
    # thawed, the machine finds its connections closed and its processes exit
    agent.wait_for(r"worker1: the master went away", 20)
    assert agent.proc.wait(timeout=20) == 1
    assert wait_gone(frozen, timeout=10) == []


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL], ids=["master-frozen", "master-killed"])
def test_the_worker_machine_cleans_up_when_the_master_freezes_or_dies(two_hosts, no_leftovers, sig):
    agent, master = start_both(two_hosts, os.urandom(32).hex())
    remote = pids_in(two_hosts.worker.netns)
    os.kill(master.proc.pid, sig)
    hit = time.monotonic()
    try:
        said = agent.wait_for(r"^worker1: (the master .*); exiting\.$", BOUND_S + 10)
        when = agent.when
        assert agent.proc.wait(timeout=10) == 1
        left = wait_gone(remote, timeout=5)
        exited = time.monotonic() - hit
    finally:
        os.kill(master.proc.pid, signal.SIGKILL)  # its fork server and rank 0 die with it
    took = when - hit
    print(f"after {signal.Signals(sig).name} of the master the agent said after {took:.1f} s "
          f"(all gone after {exited:.1f} s): {said.group(1)[:120]}")
    assert left == [] and pids_in(two_hosts.worker.netns) == []
    if sig == signal.SIGSTOP:
        assert "the master at 198.51.100.1:29600 stopped answering" in said.group(1)
        assert "Stopped this machine's ranks" in said.group(1)
        assert took < BOUND_S
    else:
        assert "the master went away" in said.group(1)
        assert took < SLACK_S
    master.proc.wait(timeout=10)
    assert wait_gone(pids_in(two_hosts.master.netns), timeout=5) == []


def test_a_cut_link_ends_both_sides_with_clear_errors(two_hosts, no_leftovers):
    agent, master = start_both(two_hosts, os.urandom(32).hex())
    remote = pids_in(two_hosts.worker.netns)
    subprocess.run(["ip", "netns", "exec", two_hosts.worker.netns, "ip", "link", "set", "eth0", "down"],
                   check=True)
    cut = time.monotonic()
    failed = master.wait_for(r"^FAILED (\w+): (.*)$", BOUND_S + 10)
    said = agent.wait_for(r"^worker1: (the master .*); exiting\.$", BOUND_S + 10)
    master_when, agent_when = master.when, agent.when
    print(f"link down: the master gave up after {master_when - cut:.1f} s, the agent after "
          f"{agent_when - cut:.1f} s")
    assert failed.group(1) == "WorkerDiedError"
    assert "worker1 on hostb stopped answering" in failed.group(2)
    assert "stopped answering" in said.group(1)
    assert master_when - cut < BOUND_S and agent_when - cut < BOUND_S
    assert master.proc.wait(timeout=30) == 0 and agent.proc.wait(timeout=10) == 1
    assert wait_gone(remote, timeout=5) == [] and pids_in(two_hosts.worker.netns) == []


# -- without namespaces ----------------------------------------------------------------------------
def test_an_agent_that_goes_silent_while_starting_fails_the_start(no_leftovers, monkeypatch):
    monkeypatch.setattr(heartbeat, "SILENT_AFTER_S", SILENT_S)  # this process is the master
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port, key = s.getsockname()[1], os.urandom(32)
    box = {}

    def start():
        try:
            box["cluster"] = ppkit.Cluster(1, listen=f"127.0.0.1:{port}", remote=["worker1"], key=key,
                                           start_timeout=60)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while True:  # an agent that is admitted, asked to fork its rank, and then says nothing at all
        try:
            conn = channel.connect(("127.0.0.1", port), key)
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    hello = AgentInfo(name="worker1", host="frozenhost", pid=1, versions=worker.versions(), iface="lo",
                      iface_addrs=("127.0.0.1",), local_address="127.0.0.1")
    conn.send(AgentHello(hello))
    assert isinstance(heartbeat.receive(conn, 60), Admitted)
    assert heartbeat.receive(conn, 60) == Spawn((0,))
    silent_since = time.monotonic()
    thread.join(BOUND_S + 10)
    took = time.monotonic() - silent_since
    conn.close()
    error = box["error"]
    print(f"the start failed {took:.1f} s after the agent went silent: {error}")
    assert isinstance(error, LaunchError)
    assert "worker1 on frozenhost stopped answering: nothing from its `ppkit worker` for 5 s" in str(error)
    assert "GLOO_SOCKET_IFNAME" not in str(error)
    assert took < BOUND_S


def all_reduce_ones(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def test_a_frozen_local_rank_ends_its_job_by_the_timeout(no_leftovers):
    # no heartbeat here: the job's own timeout is the bound, and the stopped rank says nothing
    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        frozen = cluster.workers[1]["pid"]
        os.kill(frozen, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(JobTimeoutError) as info:
            cluster.run(all_reduce_ones, timeout=3)
        took = time.monotonic() - started
        print(f"JobTimeoutError after {took:.1f} s")
        assert info.value.ranks == [0, 1] and info.value.stacks[1] == "(no answer)"
        assert "Rank(s) [1] did not even say where they wait: stopped, frozen or overloaded" in str(info.value)
        assert took < 3 + 2 + SLACK_S  # the timeout, then 2 s for the ranks' stacks
        cluster.restart()  # SIGKILL reaches a stopped process
        assert cluster.run(all_reduce_ones) == [2.0, 2.0]
        assert wait_gone([frozen]) == []
