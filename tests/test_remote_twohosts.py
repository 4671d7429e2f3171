"""Two network namespaces as two machines: the master on one, `ppkit worker` on the other.

Each test crosses a real network boundary (two addresses joined by a veth pair) and checks how
it ends: with the right answer, or with a clear error within its timeout and no process left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

import netns
import pytest
from netns import PY, Lines, host_env, skip_without_netns

from ppkit.cluster.tools.netns import TwoHosts

two_hosts = netns.two_hosts  # the fixture

pytestmark = pytest.mark.timeout(180)
PORT = 29600


def master_addr(hosts) -> str:
    return f"{hosts.master.address}:{PORT}"


def start_worker(hosts, key, *extra, launcher=("-m", "ppkit"), name="worker1", timeout=30):
    argv = [PY, *launcher, "worker", "--connect", master_addr(hosts), "--name", name,
            "--timeout", str(timeout), *extra]
    return hosts.popen(hosts.worker, argv, env=host_env(key), stdout=-1, stderr=-1, text=True)


def run_master(hosts, key, *extra, timeout=120):
    argv = [PY, "-m", "ppkit", "master", "--listen", master_addr(hosts), *extra]
    return hosts.run(hosts.master, argv, env=host_env(key), timeout=timeout)


def finish(proc, timeout=20) -> tuple[int, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def test_allreduce_across_two_hosts(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    worker = start_worker(two_hosts, key)
    master = run_master(two_hosts, key)
    code, worker_out = finish(worker)
    assert master.returncode == 0, master.stdout + master.stderr
    rows = re.findall(r"^\s+(\d)\s+(\w+)\s+(\w+)\s+\d+\s+(\S+)\s+(\S+)$", master.stdout, re.MULTILINE)
    assert rows == [("0", "master", "hosta", "eth0", "3"), ("1", "worker1", "hostb", "eth0", "3")]
    assert "(expected 3) OK" in master.stdout
    assert code == 0, worker_out
    assert "joined 198.51.100.1:29600 as rank 1 of the master's 2 worker process(es)" in worker_out
    assert "interface eth0 (198.51.100.2)" in worker_out  # found by routing, not by hostname


FAKE_TORCH = ("import dataclasses, sys, ppkit.transport.worker as w; real = w.versions; "
              "w.versions = lambda: dataclasses.replace(real(), torch='0.0.test'); "
              "from ppkit.cli import main; sys.exit(main(sys.argv[1:]))")


def test_worker_with_other_torch_is_refused_on_both_sides(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    worker = start_worker(two_hosts, key, launcher=("-c", FAKE_TORCH))
    started = time.monotonic()
    master = run_master(two_hosts, key, "--start-timeout", "60")
    took = time.monotonic() - started
    code, worker_out = finish(worker)
    assert master.returncode == 1
    assert "LaunchError: the master refused worker1: worker1 on hostb runs torch 0.0.test" in master.stderr
    assert "pip install torch==" in master.stderr
    assert code == 2
    assert "the master refused worker1" in worker_out and "torch 0.0.test (the master has" in worker_out
    assert took < 45, f"refusal took {took:.0f} s; it should not wait for the start timeout"


def test_worker_on_loopback_interface_is_refused(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    worker = start_worker(two_hosts, key, "--iface", "lo")
    master = run_master(two_hosts, key, "--start-timeout", "60")
    code, worker_out = finish(worker)
    assert master.returncode == 1 and code == 2
    for text in (master.stderr, worker_out):
        assert "would use interface 'lo' (127.0.0.1)" in text, text
        assert "reached the master from 198.51.100.2" in text


def test_wrong_interface_ends_with_clear_error(two_hosts, no_leftovers):
    # docker0 exists on the worker host, but the master has no route to its address
    key = os.urandom(32).hex()
    worker = start_worker(two_hosts, key, "--iface", "docker0")
    started = time.monotonic()
    master = run_master(two_hosts, key, "--start-timeout", "30", timeout=90)
    took = time.monotonic() - started
    code, worker_out = finish(worker)
    assert master.returncode == 1
    err = master.stderr
    assert "could not join the process group" in err and "Network is unreachable" in err
    assert ("the master's ranks use eth0 (198.51.100.1); worker1 uses docker0 (172.17.0.1). "
            "Make GLOO_SOCKET_IFNAME (`ppkit worker --iface`) name the interface") in err
    assert took < 60
    assert "interface docker0 (172.17.0.1)" in worker_out
    assert "the master closed the cluster" in worker_out and code == 0


def test_unreachable_master(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    started = time.monotonic()
    refused = start_worker(two_hosts, key, timeout=3)  # nothing listens there
    code, out = finish(refused)
    assert code == 1
    assert f"could not reach the master at {master_addr(two_hosts)}: Connection refused" in out
    assert "ppkit doctor --master" in out
    assert time.monotonic() - started < 20
    # an address with no route at all fails at once, without retrying
    argv = [PY, "-m", "ppkit", "worker", "--connect", "203.0.113.9:29600", "--name", "worker1"]
    started = time.monotonic()
    done = two_hosts.run(two_hosts.worker, argv, env=host_env(key), timeout=60)
    assert done.returncode == 1
    assert "Network is unreachable" in done.stderr
    assert time.monotonic() - started < 20


DIES_MID_JOB = """
import sys, time, ppkit
def job(rank, world_size):
    import time, torch, torch.distributed as dist
    if rank == 0:
        print("job started", flush=True)
        t = torch.zeros(1)
        dist.recv(t, src=1)
    time.sleep(60)
with ppkit.Cluster(2, listen=sys.argv[1], remote=["worker1"], start_timeout=60, timeout=60) as c:
    t = time.monotonic()
    try:
        c.run(job)
    except ppkit.WorkerDiedError as exc:
        print(f"DIED after {time.monotonic() - t:.1f} s: {exc}", flush=True)
"""


def test_worker_that_dies_mid_job(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    worker = start_worker(two_hosts, key)
    worker_lines = Lines(worker)
    master = two_hosts.popen(two_hosts.master, [PY, "-c", DIES_MID_JOB, master_addr(two_hosts)],
                             env=host_env(key), stdout=-1, stderr=-2, text=True)
    master_lines = Lines(master)
    rank_pid = int(worker_lines.wait_for(r"started rank 1 \(pid (\d+)\)", 90).group(1))
    master_lines.wait_for(r"\[rank 0\] job started", 90)
    os.kill(rank_pid, signal.SIGKILL)  # the remote rank's process, as if the OOM killer took it
    died = master_lines.wait_for(r"^DIED after ([\d.]+) s: (.*)$", 30)
    assert float(died.group(1)) < 10
    assert "rank 1 (worker1 on hostb, pid" in died.group(2)
    assert "died during the job: it was killed by signal SIGKILL" in died.group(2)
    master_lines.rest(timeout=30)
    assert master.returncode == 0
    assert "the master closed the cluster" in worker_lines.rest(timeout=30)


def test_namespaces_and_their_processes_go_even_when_the_body_fails():
    skip_without_netns()
    with pytest.raises(RuntimeError, match="boom"), TwoHosts() as hosts:
        names = [h.netns for h in hosts.hosts]
        sleeper = hosts.popen(hosts.worker, ["sleep", "60"])
        raise RuntimeError("boom")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert not any(name in listed for name in names)
    assert not any(os.path.exists(f"/etc/netns/{name}") for name in names)
    assert sleeper.poll() is not None
