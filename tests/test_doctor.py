"""``ppkit doctor``: the checks on this machine, knocking on a master's port, and the two-host flow."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import replace

import netns
import pytest
from netns import PY, Lines, host_env

from ppkit.cli import main as cli_main
from ppkit.cluster.admission import handle_probe
from ppkit.cluster.tools import doctor
from ppkit.transport import channel, worker
from ppkit.transport.messages import Probe, ProbeReply

two_hosts = netns.two_hosts  # the fixture


def test_report_lists_versions_interfaces_and_reads_as_a_table():
    report = doctor.diagnose(environ={})
    names = [c.name for c in report.checks]
    assert names[:2] == ["versions", "hostname"]
    assert "interface lo" in names and "GLOO_SOCKET_IFNAME" in names and "TP_SOCKET_IFNAME" in names
    versions = worker.versions()
    assert report.checks[0].detail == f"python {versions.python}, torch {versions.torch}, ppkit {versions.ppkit}"
    text = str(report)
    assert text.splitlines()[0] == f"ppkit doctor on {socket.gethostname()}"
    assert "interface lo" in text and "127.0.0.1 (loopback)" in text
    assert "<table>" in report._repr_html_()
    assert report.ok


def test_an_interface_that_does_not_exist_fails():
    report = doctor.diagnose(environ={"GLOO_SOCKET_IFNAME": "eth99"})
    assert report.status_of("GLOO_SOCKET_IFNAME") == "FAIL"
    assert not report.ok
    assert "'eth99' is not an interface here" in str(report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_is_a_clear_failure():
    port = free_port()
    started = time.monotonic()
    report = doctor.diagnose(f"127.0.0.1:{port}", environ={})
    assert time.monotonic() - started < 10
    assert report.status_of("route to master") == "ok"
    assert report.status_of("master port") == "FAIL"
    assert f"connection refused: nothing listens on 127.0.0.1:{port}" in str(report)
    assert not report.ok


def test_another_program_on_the_port_is_not_taken_for_a_master():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer():
            conn, _ = server.accept()
            conn.sendall(b"SSH-2.0-OpenSSH\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        status, detail, _ = doctor.probe("127.0.0.1", server.getsockname()[1], key=None)
    assert status == "warn" and "is not a ppkit master" in detail


class FakeMaster:
    """A ppkit control channel that answers doctor's probe with the given versions."""

    def __init__(self, key: bytes, reply: ProbeReply | None = None):
        self.reply = reply

        def on_connect(conn):
            first = conn.recv()
            assert first == Probe()
            if self.reply is None:
                handle_probe(conn)  # what a real Cluster answers
            else:
                conn.send(self.reply)
                conn.close()

        self.server = channel.ChannelServer("127.0.0.1", 0, key, on_connect)
        self.where = "{}:{}".format(*self.server.address)


def test_probe_with_the_key_compares_versions_with_the_master():
    key = os.urandom(32)
    master = FakeMaster(key)
    try:
        report = doctor.diagnose(master.where, key=key, environ={})
        assert report.status_of("master port") == "ok"
        assert "accepts this key" in str(report)
        assert report.status_of("versions vs master") == "ok"
        assert doctor.diagnose(master.where, environ={}).status_of("versions vs master") is None
        wrong = doctor.diagnose(master.where, key=os.urandom(32), environ={})
        assert wrong.status_of("master port") == "FAIL" and "refuses this key" in str(wrong)
    finally:
        master.server.close()


def test_a_master_with_other_versions_fails_with_what_to_install():
    key = os.urandom(32)
    theirs = ProbeReply("bigbox", replace(worker.versions(), torch="9.9.9"))
    master = FakeMaster(key, theirs)
    try:
        report = doctor.diagnose(master.where, environ={channel.KEY_ENV: key.hex()})
    finally:
        master.server.close()
    assert report.status_of("versions vs master") == "FAIL"
    text = " ".join(str(report).split())
    assert "(the master has 9.9.9)" in text and "pip install torch==9.9.9" in text


def test_cli_exit_codes(capsys):
    assert cli_main(["doctor", "--master", "no-port-here:"]) == 2
    assert "--master must be ADDR:PORT" in capsys.readouterr().err
    assert cli_main(["doctor", "--master", f"127.0.0.1:{free_port()}"]) == 1
    assert "FAIL" in capsys.readouterr().out


@pytest.mark.timeout(150)
def test_doctor_on_the_worker_host_while_the_master_waits(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    where = f"{two_hosts.master.address}:29600"
    master = two_hosts.popen(two_hosts.master, [PY, "-m", "ppkit", "master", "--listen", where,
                                                "--start-timeout", "90"],
                             env=host_env(key), stdout=-1, stderr=-2, text=True)
    master_lines = Lines(master)
    master_lines.wait_for("Waiting for worker1 to join", 60)  # it listens now
    argv = [PY, "-m", "ppkit", "doctor", "--master", where]
    done = two_hosts.run(two_hosts.worker, argv, env=host_env(key))
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout
    assert "ppkit doctor on hostb" in out
    assert "hostname warn hostb resolves to 127.0.1.1 (loopback)" in out
    assert "interface eth0 info 198.51.100.2 (network) <- reaches the master" in out
    assert "interface docker0 info 172.17.0.1 (container bridge)" in out
    assert "route to master ok 198.51.100.1 via eth0 (from 198.51.100.2)" in out
    assert "accepts this key" in out and "versions vs master ok" in out
    assert "export GLOO_SOCKET_IFNAME=eth0 TP_SOCKET_IFNAME=eth0" in out

    wrong = two_hosts.run(two_hosts.worker, argv, env=host_env(key, GLOO_SOCKET_IFNAME="docker0"))
    assert "GLOO_SOCKET_IFNAME warn docker0 (but eth0 reaches the master)" in " ".join(wrong.stdout.split())

    # what doctor said is enough: the worker joins and the master's check passes
    worker_proc = two_hosts.popen(two_hosts.worker, [PY, "-m", "ppkit", "worker", "--connect", where,
                                                     "--name", "worker1"], env=host_env(key))
    out = master_lines.rest(timeout=90)
    assert master.returncode == 0, out
    assert "(expected 3) OK" in out
    assert worker_proc.wait(timeout=30) == 0
