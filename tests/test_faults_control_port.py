"""Strangers on the control port: a flood of silent connections, a client that trickles its bytes,
a controller out of file descriptors or threads. None of them may stop the cluster.

The attacks run as separate processes that know no key; each test measures how long the
stranger was held, how many threads the controller grew, and that the real workers still get in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import ppkit
from ppkit.transport import channel

pytestmark = pytest.mark.timeout(120)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLACK_S = 3.0  # a loaded two-core machine is late by this much at most

# A stranger: one client that trickles a well-framed answer a byte every 0.5 s (a per-read timeout
# would never fire) and N that connect and say nothing. It prints how long the controller kept
# each of them, from its own connect.
FLOOD = r"""
import json, select, socket, struct, sys, time
addr, n = (sys.argv[1], int(sys.argv[2])), int(sys.argv[3])
since = {}
def connect():
    s = socket.create_connection(addr)
    since[s.fileno()] = time.monotonic()
    return s
trickler = connect()
tfd = trickler.fileno()
silent = [connect() for _ in range(n)]
print("READY", flush=True)
held, got_challenge = {}, set()
open_ = {s.fileno(): s for s in [trickler, *silent]}
trickle = struct.pack("!i", 200) + b"x" * 200  # 102 s at this pace
next_byte = time.monotonic()
while open_ and time.monotonic() - since[tfd] < 60:
    if tfd in open_ and time.monotonic() >= next_byte:
        try:
            trickler.send(trickle[:1])
            trickle = trickle[1:]
        except OSError:
            pass
        next_byte += 0.5
    readable, _, _ = select.select(list(open_.values()), [], [], 0.1)
    for s in readable:
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if data:
            got_challenge.add(s.fileno())
            continue
        fd = s.fileno()
        held["trickler" if fd == tfd else f"silent{fd}"] = time.monotonic() - since[fd]
        del open_[fd]
        s.close()
print(json.dumps({"held": held, "left_open": len(open_), "challenged": len(got_challenge)}), flush=True)
"""


def flood(address, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FLOOD, address[0], str(address[1]), str(count)],
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_flood_of_silent_connections_and_a_trickler_do_not_stop_the_cluster(no_leftovers):
    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        before = threading.active_count()
        stranger = flood(cluster.address, 200)
        try:
            assert stranger.stdout.readline().strip() == "READY"
            peak = before
            end = time.monotonic() + 2.0
            while time.monotonic() < end:  # the strangers hold what they can now
                peak = max(peak, threading.active_count())
                time.sleep(0.05)
            # while every slot is taken, a client is closed before its challenge and says so
            with pytest.raises(channel.ChannelBusy, match="key-check slots stayed taken"):
                channel.connect(cluster.address, cluster._key, timeout=1)
            started = time.monotonic()
            cluster.restart()  # the new ranks must get in once the strangers' time is up
            restarted = time.monotonic() - started
            assert cluster.run(lambda rank, world_size: rank * 10) == [0, 10]
            report = json.loads(stranger.communicate(timeout=60)[0])
        finally:
            if stranger.poll() is None:
                stranger.kill()
                stranger.communicate()
    held = report["held"]
    silent = sorted(v for k, v in held.items() if k.startswith("silent"))
    print(f"threads {before} -> peak {peak}; restart took {restarted:.1f} s; trickler held "
          f"{held['trickler']:.1f} s; silent held at most {silent[-1]:.1f} s; "
          f"{report['challenged']} of 201 got a challenge, the others were closed before it")
    assert peak - before <= channel.MAX_HANDSHAKES, (before, peak)
    assert report["left_open"] == 0 and len(silent) == 200
    assert held["trickler"] < channel.HANDSHAKE_TIMEOUT_S + SLACK_S
    assert silent[-1] < channel.HANDSHAKE_TIMEOUT_S + SLACK_S
    assert report["challenged"] <= channel.MAX_HANDSHAKES  # the rest never reached a key check
    assert restarted < channel.HANDSHAKE_TIMEOUT_S + 30


# A controller with almost no file descriptor left: accept() fails with EMFILE while strangers
# hold the descriptors; once they go, the same accept loop lets a client with the key in.
EMFILE_SERVER = r"""
import os, resource, sys, time
from ppkit.transport import channel
key = bytes.fromhex(sys.argv[1])
server = channel.ChannelServer("127.0.0.1", 0, key, lambda conn: conn.send(("echo", conn.recv())))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 3, hard))
print(server.address[1], flush=True)
while server.accept_failures == 0:
    time.sleep(0.05)
print("ACCEPT FAILED", flush=True)
sys.stdin.readline()
print(f"failures={server.accept_failures} alive={server._thread.is_alive()}", flush=True)
"""


def test_the_accept_loop_outlives_running_out_of_file_descriptors():
    import socket

    key = os.urandom(32)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen([sys.executable, "-c", EMFILE_SERVER, key.hex()], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    strangers = []
    try:
        port = int(server.stdout.readline())
        strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(12)]
        assert server.stdout.readline().strip() == "ACCEPT FAILED"
        for sock in strangers:
            sock.close()
        started = time.monotonic()
        conn = channel.connect(("127.0.0.1", port), key, timeout=20)
        conn.send("hello")
        assert conn.recv() == ("echo", "hello")
        took = time.monotonic() - started
        conn.close()
        out, _ = server.communicate("\n", timeout=20)
    finally:
        for sock in strangers:
            sock.close()
        if server.poll() is None:
            server.kill()
            server.communicate()
    print(f"{out.strip()}; the client with the key got in {took:.2f} s after the strangers left")
    assert "alive=True" in out
    assert took < 5


def test_a_failed_thread_start_closes_that_connection_and_the_loop_goes_on(monkeypatch):
    key, failures, real = os.urandom(32), iter([True, True, True]), channel._start_thread

    def no_thread_the_first_three_times(target, *args):
        if next(failures, False):
            raise RuntimeError("can't start new thread")
        real(target, *args)

    monkeypatch.setattr(channel, "_start_thread", no_thread_the_first_three_times)
    rejected = []
    server = channel.ChannelServer("127.0.0.1", 0, key, lambda conn: conn.send("welcome"), rejected.append)
    try:
        conn = channel.connect(server.address, key, timeout=10)  # closed before its challenge: retried
        assert conn.recv() == "welcome"
        conn.close()
    finally:
        server.close()
    assert [str(exc) for exc in rejected] == ["can't start new thread"] * 3
    assert server.rejected == 3


def test_a_closed_server_ends_its_accept_loop():
    server = channel.ChannelServer("127.0.0.1", 0, os.urandom(32), lambda conn: conn.close())
    server.close()
    server._thread.join(5)
    assert not server._thread.is_alive()
    server.close()  # twice is fine


def test_the_readme_states_the_limits_the_code_has():
    from ppkit.transport import heartbeat

    with open(os.path.join(REPO, "README.md")) as f:
        text = " ".join(f.read().split())
    assert (f"can hold at most {channel.MAX_HANDSHAKES} key-check slots, each for at most "
            f"{channel.HANDSHAKE_TIMEOUT_S:g} s") in text
    assert f"a heartbeat every {heartbeat.HEARTBEAT_EVERY_S:g} s" in text
    assert f"gives up within {heartbeat.SILENT_AFTER_S:g} s" in text
