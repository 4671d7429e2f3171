"""Listen mode on loopback (no root needed): admission by name, refusals, restart, bad input."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

import ppkit
from ppkit.cluster import admission
from ppkit.errors import AuthenticationError, ConfigError, LaunchError
from ppkit.transport import agent, channel, heartbeat, worker
from ppkit.transport.messages import Admitted, AgentHello, AgentInfo, Kill, Reject, Shutdown, Spawn, Versions

pytestmark = pytest.mark.timeout(120)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_cli(port: int, key: str, name: str = "worker1", *extra) -> subprocess.Popen:
    env = {**os.environ, "PPKIT_KEY": key, "PYTHONPATH": REPO}
    return subprocess.Popen([sys.executable, "-m", "ppkit", "worker", "--connect", f"127.0.0.1:{port}",
                             "--name", name, *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


# -- pure functions ---------------------------------------------------------------------------
def test_parse_listen():
    assert admission.parse_listen("127.0.0.1:1234") == ("127.0.0.1", 1234)
    assert admission.parse_listen("127.0.0.1") == ("127.0.0.1", admission.DEFAULT_PORT)
    assert admission.parse_listen("localhost:0") == ("127.0.0.1", 0)
    for bad in ("", "127.0.0.1:http", "127.0.0.1:70000", 5):
        with pytest.raises(ConfigError, match="listen must be 'ADDR:PORT'"):
            admission.parse_listen(bad)


def test_remote_names_give_ranks_in_order():
    assert admission.remote_names(3, None) == ["worker1", "worker2"]
    assert admission.remote_names(3, 1) == ["worker1"]
    assert admission.remote_names(2, ["gpu-box", "laptop"]) == ["gpu-box", "laptop"]
    assert admission.remote_names(2, {"worker1": "alice@b"}) == ["worker1"]
    with pytest.raises(ConfigError, match="room for 1 to 2 remote workers, not 3"):
        admission.remote_names(2, 3)
    with pytest.raises(ConfigError, match="different from each other"):
        admission.remote_names(2, ["a", "a"])
    with pytest.raises(ConfigError, match="words like 'worker1'"):
        admission.remote_names(2, ["bad name"])
    with pytest.raises(ConfigError, match="number of workers"):
        admission.remote_names(2, True)


def test_version_problem_names_every_difference_and_the_fix():
    ours = Versions(python="3.11.7", torch="2.14.1", ppkit="0.1.0")
    assert admission.version_problem(ours, Versions("3.11.9", "2.14.1", "0.1.0"), "worker1", "b") is None
    text = admission.version_problem(ours, Versions(python="3.10.2", torch="2.3.0", ppkit="0.1.0"), "worker1", "b")
    assert text.startswith("worker1 on b runs python 3.10.2 (the master has 3.11.7), torch 2.3.0 "
                           "(the master has 2.14.1).")
    assert "pip install torch==2.14.1" in text and "ppkit==" not in text


def test_interface_problem_only_for_loopback_towards_a_remote_master():
    info = AgentInfo(name="worker1", host="b", pid=1, versions=worker.versions(), iface="lo",
                     iface_addrs=("127.0.0.1",), local_address="10.0.0.2")
    assert "would use interface 'lo' (127.0.0.1)" in admission.interface_problem(info, "10.0.0.1")
    assert admission.interface_problem(info, "127.0.0.1") is None
    assert admission.interface_problem(replace(info, iface_addrs=("10.0.0.2",)), "10.0.0.1") is None


def test_parse_key(monkeypatch):
    monkeypatch.delenv(channel.KEY_ENV, raising=False)
    assert len(admission.parse_key(None)) == 32
    # (not "ab" * 16: one repeated byte is refused as trivially weak, see test_cluster_keys.py)
    assert admission.parse_key("ab01" + "cd" * 14) == bytes.fromhex("ab01" + "cd" * 14)
    monkeypatch.setenv(channel.KEY_ENV, "cd02" + "ef" * 14)
    assert admission.parse_key(None) == bytes.fromhex("cd02" + "ef" * 14)
    for bad in ("xyz", "ab", b"short"):
        with pytest.raises(ConfigError):
            admission.parse_key(bad)


def test_bad_listen_settings_fail_before_anything_starts(no_leftovers, monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    with pytest.raises(ConfigError, match="not an address of this machine"):
        ppkit.Cluster(1, listen="203.0.113.7:0", remote=1)
    with pytest.raises(ConfigError, match="does not say which address"):
        ppkit.Cluster(1, listen="0.0.0.0:0", remote=1)
    with pytest.raises(ConfigError, match="gloo"):  # no GPU here, or remote workers need gloo
        ppkit.Cluster(1, "nccl", listen="127.0.0.1:0", remote=1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        with pytest.raises(LaunchError, match="already listens on that port"):
            ppkit.Cluster(1, listen=f"127.0.0.1:{busy.getsockname()[1]}", remote=1)


# -- the whole path on loopback ----------------------------------------------------------------
@pytest.mark.slow
def test_remote_worker_joins_runs_restarts_and_leaves(no_leftovers, capsys):
    port, key = free_port(), os.urandom(32).hex()
    proc = worker_cli(port, key)
    try:
        with ppkit.Cluster(2, listen=f"127.0.0.1:{port}", key=key, start_timeout=60) as cluster:
            def add(rank, world_size):
                import torch
                import torch.distributed as dist

                t = torch.tensor([rank + 1.0])
                dist.all_reduce(t)
                return t.item(), os.getpid()

            (s0, _), (s1, pid1) = cluster.run(add)
            assert s0 == s1 == 3.0
            assert cluster.workers[1]["pid"] == pid1
            cluster.restart()  # the agent forks a fresh rank 1
            (_, _), (_, pid1b) = cluster.run(add)
            assert pid1b != pid1
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    printed = capsys.readouterr().out
    assert f"PPKIT_KEY={key} ppkit worker --connect 127.0.0.1:{port} --name worker1" in printed
    assert proc.returncode == 0
    assert out.count("worker1: started rank 1") == 2
    assert "the master closed the cluster; exiting." in out


class FakeAgent:
    """Speaks the agent's side of the protocol by hand, to test the master's admission."""

    def __init__(self, port, key: bytes, name: str, **versions):
        self.conn = channel.connect(("127.0.0.1", port), key)
        hello = AgentInfo(name=name, host="fakehost", pid=1, versions=replace(worker.versions(), **versions),
                          iface="lo", iface_addrs=("127.0.0.1",), local_address="127.0.0.1")
        self.conn.send(AgentHello(hello))
        self.reply = self.recv()

    def recv(self):
        """The master's next message, past its heartbeats (it sends them from our hello on)."""
        return heartbeat.receive(self.conn, 60)


def start_in_thread(**kwargs):
    box = {}

    def target():
        try:
            box["cluster"] = ppkit.Cluster(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def connect_when_listening(port, key, name, deadline=30, **override):
    end = time.monotonic() + deadline
    while True:
        try:
            return FakeAgent(port, key, name, **override)
        except ConnectionRefusedError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


@pytest.mark.slow
def test_unknown_and_duplicate_names_are_refused_and_a_silent_worker_times_out(no_leftovers):
    port, key = free_port(), os.urandom(32)
    thread, box = start_in_thread(world_size=1, listen=f"127.0.0.1:{port}", remote=["worker1"], key=key,
                                  start_timeout=4)
    stranger = connect_when_listening(port, key, "worker9")
    assert isinstance(stranger.reply, Reject)
    assert "expects the worker(s) worker1, not 'worker9'" in stranger.reply.reason
    first = FakeAgent(port, key, "worker1")
    assert first.reply == Admitted(rank=0, world_size=1, master=f"127.0.0.1:{port}")
    assert first.recv() == Spawn((0,))  # ... and it never starts the rank
    again = FakeAgent(port, key, "worker1")
    assert isinstance(again.reply, Reject) and "worker1 has already joined from fakehost" in again.reply.reason
    thread.join(30)
    error = box["error"]
    assert isinstance(error, LaunchError)
    assert ("timed out after 4 s waiting for worker1 (rank 0 of 1, on fakehost, interface lo "
            "127.0.0.1) to join the process group") in str(error)
    assert "connected but never finished joining the process group" in str(error)
    assert first.recv() == Kill()  # the master cleans up what it asked for
    assert isinstance(first.recv(), Shutdown)


@pytest.mark.slow
def test_a_worker_that_never_comes_is_named_with_the_command_to_run(no_leftovers):
    port, key = free_port(), os.urandom(32)
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        ppkit.Cluster(1, listen=f"127.0.0.1:{port}", remote=["laptop"], key=key, start_timeout=2)
    assert time.monotonic() - started < 10
    text = str(info.value)
    assert "waiting for laptop (rank 0 of 1) to connect" in text
    # the key itself only in the first start's printed command: error texts land in saved notebooks
    assert (f"PPKIT_KEY={key.hex()[:4]}... (the key printed at the first start) ppkit worker --connect "
            f"127.0.0.1:{port} --name laptop") in text
    assert key.hex() not in text
    assert f"ppkit doctor --master 127.0.0.1:{port}" in text


@pytest.mark.slow
def test_a_missing_worker_is_what_the_masters_own_rank_waits_for_too(no_leftovers):
    # `ppkit master` with a worker that never comes: its own rank 0 is started and waits in the process group for
    # the worker, and the timeout says so rather than listing rank 0 as missing beside it
    port, key = free_port(), os.urandom(32)
    with pytest.raises(LaunchError) as info:
        ppkit.Cluster(2, listen=f"127.0.0.1:{port}", remote=["laptop"], key=key, start_timeout=3)
    assert ("waiting for local rank(s) [0] (started, waiting in the process group for the remote rank(s) below), "
            "laptop (rank 1 of 2) to connect") in str(info.value)


def test_version_mismatch_is_refused_at_once(no_leftovers):
    port, key = free_port(), os.urandom(32)
    thread, box = start_in_thread(world_size=1, listen=f"127.0.0.1:{port}", remote=1, key=key,
                                  start_timeout=60)
    started = time.monotonic()
    fake = connect_when_listening(port, key, "worker1", ppkit="0.0.1")
    assert isinstance(fake.reply, Reject) and "ppkit 0.0.1 (the master has" in fake.reply.reason
    thread.join(30)
    assert time.monotonic() - started < 15
    assert "the master refused worker1: worker1 on fakehost runs ppkit 0.0.1" in str(box["error"])


# -- the worker command line -------------------------------------------------------------------
def parse(*argv):
    import argparse

    from ppkit.cli import worker as cli_worker

    parser = argparse.ArgumentParser()
    cli_worker.add_arguments(parser)
    return cli_worker, parser.parse_args(list(argv))


def test_worker_cli_needs_an_address_a_name_and_a_key():
    cli_worker, args = parse("--name", "worker1")
    with pytest.raises(ConfigError, match="--connect missing"):
        cli_worker.resolve(args, environ={})
    cli_worker, args = parse("--connect", "10.0.0.1:29600", "--name", "worker1")
    with pytest.raises(ConfigError, match="no key: set PPKIT_KEY"):
        cli_worker.resolve(args, environ={})
    with pytest.raises(ConfigError, match="hex digits"):
        cli_worker.resolve(args, environ={"PPKIT_KEY": "not hex"})
    assert cli_worker.resolve(args, environ={"PPKIT_KEY": "ab" * 16}) == (
        ("10.0.0.1", 29600), "worker1", b"\xab" * 16)
    cli_worker, args = parse("--connect", "10.0.0.1", "--name", "w", "--key", "ab" * 16)
    with pytest.raises(ConfigError, match="--connect must be ADDR:PORT"):
        cli_worker.resolve(args, environ={})


def test_worker_cli_reads_torchrun_and_slurm_variables():
    pytest.importorskip("ppkit.cluster.tools.env", reason="read_launch_env comes from the lessons branch")
    cli_worker, args = parse("--key", "ab" * 16)
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "29500"}
    assert cli_worker.resolve(args, environ=torchrun)[:2] == (("10.0.0.1", 29600), "worker1")
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0",
             "SLURM_NODELIST": "node[07-09]"}
    assert cli_worker.resolve(args, environ=slurm)[:2] == (("node07", 29600), "worker2")


def test_worker_cli_exit_codes(capsys):
    from ppkit.cli import main

    assert main(["worker", "--name", "worker1"]) == 2
    assert "--connect missing" in capsys.readouterr().err
    port = free_port()
    started = time.monotonic()
    code = main(["worker", "--connect", f"127.0.0.1:{port}", "--name", "w", "--key", "ab" * 16,
                 "--timeout", "1.5"])
    assert code == 1 and time.monotonic() - started < 10
    assert f"could not reach the master at 127.0.0.1:{port}: Connection refused" in capsys.readouterr().err


def test_agent_with_a_wrong_key_is_refused():
    server = channel.ChannelServer("127.0.0.1", 0, os.urandom(32), lambda conn: conn.close())
    try:
        with pytest.raises(AuthenticationError, match="refused this client's key"):
            agent.connect(server.address, os.urandom(32), timeout=5)
    finally:
        server.close()


# -- an RPC world with remote workers ------------------------------------------------------------
def test_rpc_world_remote_workers_are_the_last_ones():
    names = ["worker1", "worker2", "worker3"]
    assert admission.rpc_remote_names(names, None) == names
    assert admission.rpc_remote_names(names, 1) == ["worker3"]
    assert admission.rpc_remote_names(names, ["worker2", "worker3"]) == ["worker2", "worker3"]
    hosts = {"worker3": "alice@c"}
    assert admission.rpc_remote_names(names, hosts) is hosts
    with pytest.raises(ConfigError, match=r"remote=\['worker3'\], not \['worker1'\]"):
        admission.rpc_remote_names(names, ["worker1"])


@pytest.mark.slow
def test_rpc_world_with_a_remote_worker_on_loopback(no_leftovers):
    import torch.distributed.rpc as rpc

    port, key = free_port(), os.urandom(32).hex()
    proc = worker_cli(port, key)
    try:
        with ppkit.start_rpc(1, listen=f"127.0.0.1:{port}", key=key, start_timeout=60) as world:
            assert world.names == ["master", "worker1"]
            assert rpc.rpc_sync("worker1", os.getpid) != os.getpid()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "the master closed the cluster" in out


@pytest.mark.slow
def test_listen_mode_listens_on_the_given_address_only(no_leftovers):
    import psutil

    def listening():
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN}

    before = listening()
    port, key = free_port(), os.urandom(32).hex()
    env = {**os.environ, "PPKIT_KEY": key, "PYTHONPATH": REPO}
    proc = subprocess.Popen([sys.executable, "-m", "ppkit", "worker", "--connect", f"127.0.0.2:{port}",
                             "--name", "worker1"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        with ppkit.Cluster(1, listen=f"127.0.0.2:{port}", remote=1, key=key, start_timeout=60) as cluster:
            assert cluster.run(lambda rank, world_size: world_size) == [1]
            opened = listening() - before
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the control channel and the TCPStore, both on the listen address and nowhere else
    assert ("127.0.0.2", port) in opened and len(opened) == 2, opened
    assert {ip for ip, _ in opened} == {"127.0.0.2"}


MASTER_THAT_WAITS = """
import sys, time, ppkit
cluster = ppkit.Cluster(1, listen=sys.argv[1], remote=1, start_timeout=60)
print("ready", cluster.workers[0]["pid"], flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_worker_machine_is_left_clean_when_the_master_is_killed(no_leftovers):
    from leftovers import wait_gone

    port, key = free_port(), os.urandom(32).hex()
    env = {**os.environ, "PPKIT_KEY": key, "PYTHONPATH": REPO}
    worker = worker_cli(port, key)
    master = subprocess.Popen([sys.executable, "-c", MASTER_THAT_WAITS, f"127.0.0.1:{port}"], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("ready"):  # after the "Waiting for worker1" lines
            line = master.stdout.readline()
            assert line, "the master ended early"
        rank_pid = int(line.split()[1])
        master.kill()  # like a notebook kernel killed on machine A
        out, _ = worker.communicate(timeout=20)
    finally:
        for proc in (master, worker):
            if proc.poll() is None:
                proc.kill()
        master.wait()
    assert worker.returncode == 1
    assert "the master went away" in out
    assert not wait_gone([rank_pid], timeout=5), "the remote rank outlived its master"
