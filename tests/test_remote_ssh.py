"""Starting workers over ssh: the command line that is built, and the whole path with a stand-in
for ssh that runs the command on this machine (no real ssh, no other host)."""

from __future__ import annotations

import os
import shlex
import socket
import sys

import psutil
import pytest
from leftovers import wait_gone

import ppkit
from ppkit.cluster.launchers import ssh
from ppkit.errors import ConfigError, LaunchError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_worker_command_runs_ppkit_worker_through_ssh_in_batch_mode():
    argv = ssh.worker_command("alice@10.0.0.2", "10.0.0.1:29600", "worker1")
    assert argv[:-2] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    assert argv[-2] == "alice@10.0.0.2"
    remote_line = argv[-1]
    assert remote_line == ("read -r PPKIT_KEY && export PPKIT_KEY && exec python3 -m ppkit worker "
                           "--connect 10.0.0.1:29600 --name worker1")


def test_worker_command_quotes_paths_and_passes_the_interface():
    host = ssh.SSHHost("bob@gpu box", python="/opt/my env/bin/python", iface="eth1",
                       ssh=("ssh", "-p", "2222"))
    argv = ssh.worker_command(host, "10.0.0.1:29600", "gpu-1")
    assert argv[:4] == ["ssh", "-p", "2222", "bob@gpu box"]
    words = shlex.split(argv[-1].split("exec ", 1)[1])  # as the remote shell splits it
    assert words == ["/opt/my env/bin/python", "-m", "ppkit", "worker", "--connect", "10.0.0.1:29600",
                     "--name", "gpu-1", "--iface", "eth1"]


def test_the_key_never_appears_on_a_command_line():
    key = os.urandom(32)
    argv = ssh.worker_command("alice@b", "10.0.0.1:29600", "worker1")
    assert key.hex() not in " ".join(argv) and "PPKIT_KEY=" not in " ".join(argv)
    with pytest.raises(ConfigError, match="user@host"):
        ssh.worker_command("", "10.0.0.1:29600", "worker1")


FAKE_SSH = """#!/bin/sh
# stands in for ssh: skips the options and the destination, runs the command on this machine
while [ "$1" = "-o" ] || [ "$1" = "-p" ]; do shift 2; done
shift
exec sh -c "$1"
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cluster_starts_its_worker_over_ssh(tmp_path, no_leftovers, monkeypatch):
    fake = tmp_path / "fake_ssh"
    fake.write_text(FAKE_SSH)
    monkeypatch.setenv("PYTHONPATH", REPO)
    host = ssh.SSHHost("alice@localhost", python=sys.executable,
                       ssh=("sh", str(fake), "-o", "BatchMode=yes"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ppkit.Cluster(2, listen=f"127.0.0.1:{port}", remote={"worker1": host},
                       start_timeout=60) as cluster:
        assert cluster.run(lambda rank, world_size: os.getppid() != os.getpid()) == [True, True]
        # the "ssh" this process started for worker1 (the fake execs the worker command in its place)
        ssh_pids = [p.pid for p in psutil.Process().children() if "worker1" in " ".join(p.cmdline())]
        assert len(ssh_pids) == 1, [" ".join(p.cmdline()) for p in psutil.Process().children()]
    assert wait_gone(ssh_pids, 5.0) == []  # the worker ended with the cluster


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_failing_ssh_is_reported_with_what_it_said(tmp_path, no_leftovers):
    fake = tmp_path / "fake_ssh"
    fake.write_text("#!/bin/sh\necho 'alice@b: Permission denied (publickey).' >&2\nexit 255\n")
    host = ssh.SSHHost("alice@b", ssh=("sh", str(fake)))
    with pytest.raises(LaunchError) as info:
        ppkit.Cluster(1, listen="127.0.0.1:0", remote={"worker1": host}, start_timeout=3)
    assert "worker1 never connected" in str(info.value)
    assert "ssh said:\nalice@b: Permission denied (publickey)." in str(info.value)
