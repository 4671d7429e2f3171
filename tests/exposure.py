"""What another user of this machine can reach of a set of processes (issue 24, part 2).

    found = exposure(pids, prober)      # pids: a learner's kernel, fork server, workers
    assert not [f for f in found if f.verdict == OPEN], table(found)

``listeners(pids)`` lists every TCP socket (IPv4 and IPv6) and every Unix socket (pathname or
abstract) that those processes listen on, read from /proc as root: the sockets a process holds
(/proc/PID/fd) matched against the tables of its own network namespace (/proc/PID/net/...), so
sockets inside a private namespace are listed too. ``probe(endpoints, user)`` then tries each one
as ``user`` (a child of this process that drops to that user's uid and gids, never root), from
that user's place on the machine, and sorts what happens into three verdicts:

- ``challenge``: the listener speaks first with ppkit's key check (``multiprocessing.connection``'s
  ``#CHALLENGE#`` message): nothing is read from a client that does not know the key;
- ``open``: it accepts the connection and waits for the client's words without any challenge (torch's
  TCPStore, gloo's pairs, TensorPipe): a stranger can talk to it;
- ``unreachable``: the connection cannot be made (refused, a 0700 directory, or a network namespace the
  user cannot enter), or is closed at once without a word.

Nothing is sent to a listener: each probe connects, waits for the first bytes, and closes.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass

CHALLENGE, OPEN, UNREACHABLE = "challenge", "open", "unreachable"
VERDICTS = (CHALLENGE, OPEN, UNREACHABLE)
CLONE_NEWNET = 0x40000000
TCP_LISTEN = "0A"
UNIX_ACCEPTCON = 0x10000
WAIT_S = 1.5  # how long a probe waits for a listener's first bytes


@dataclass(frozen=True)
class Endpoint:
    kind: str          # "tcp" or "unix"
    address: str       # an IP address, a path, or "@name" for an abstract Unix socket
    port: int | None   # TCP only
    pid: int           # a process that holds it
    netns: str         # that process's network namespace, e.g. "net:[4026531840]"

    def __str__(self) -> str:
        where = f"{self.address}:{self.port}" if self.kind == "tcp" else self.address
        return f"{self.kind} {where} (pid {self.pid})"


@dataclass(frozen=True)
class Finding:
    endpoint: Endpoint
    verdict: str       # one of VERDICTS
    detail: str        # what happened, in words


# -- listing -------------------------------------------------------------------------------------
def _socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def _ip(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four little-endian words
    return socket.inet_ntop(socket.AF_INET6, words)


def _tcp_listeners(pid: int, inodes: set[str], netns: str) -> list[Endpoint]:
    found = []
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == TCP_LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.append(Endpoint("tcp", _ip(address), int(port, 16), pid, netns))
    return found


def _unix_listeners(pid: int, inodes: set[str], netns: str) -> list[Endpoint]:
    found = []
    for line in open(f"/proc/{pid}/net/unix").read().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and int(fields[3], 16) & UNIX_ACCEPTCON and fields[6] in inodes:
            found.append(Endpoint("unix", fields[7], None, pid, netns))
    return found


def listeners(pids) -> list[Endpoint]:
    """Every listening TCP and Unix socket held by one of ``pids`` (run as root, or as their owner)."""
    found: dict[tuple, Endpoint] = {}
    for pid in pids:
        try:
            netns = os.readlink(f"/proc/{pid}/ns/net")
            inodes = _socket_inodes(pid)
            held = _tcp_listeners(pid, inodes, netns) + _unix_listeners(pid, inodes, netns)
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        for endpoint in held:  # a socket shared by a parent and its forks: listed once
            found.setdefault((endpoint.kind, endpoint.address, endpoint.port, endpoint.netns), endpoint)
    return list(found.values())


# -- probing, as another user ---------------------------------------------------------------------
def _first_bytes(sock: socket.socket) -> bytes | None:
    """The listener's first bytes (b"" if it closed), None if it said nothing within WAIT_S."""
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(64)
    except TimeoutError:
        return None
    except OSError:
        return b""


def _classify(sock: socket.socket) -> tuple[str, str]:
    first = _first_bytes(sock)
    if first is None:
        return OPEN, f"accepted, and waited {WAIT_S:g} s for the client's words without any challenge"
    if first[4:15] == b"#CHALLENGE#":
        return CHALLENGE, "accepted, then sent ppkit's key challenge first"
    if first == b"":
        return UNREACHABLE, "accepted, then closed at once without a word"
    return OPEN, f"accepted and spoke first without a challenge: {first[:20]!r}"


def _enter_netns(endpoint: Endpoint) -> str | None:
    """Join the endpoint's network namespace if this process may (None), else why not."""
    path = f"/proc/{endpoint.pid}/ns/net"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return f"in another network namespace ({endpoint.netns}); opening {path}: {exc.strerror}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            return f"in another network namespace ({endpoint.netns}); setns: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(fd)
    return None


def try_endpoint(endpoint: Endpoint) -> Finding:
    """Connect to ``endpoint`` as this process is (call it in a process that already is the prober)."""
    needs_netns = endpoint.kind == "tcp" or endpoint.address.startswith("@")  # a path is reached as a file
    if needs_netns and endpoint.netns != os.readlink("/proc/self/ns/net"):
        reason = _enter_netns(endpoint)
        if reason is not None:
            return Finding(endpoint, UNREACHABLE, reason)
    if endpoint.kind == "tcp":
        family = socket.AF_INET6 if ":" in endpoint.address else socket.AF_INET
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(endpoint.address, endpoint.address)
        target = (host, endpoint.port)
    else:
        family = socket.AF_UNIX
        target = "\0" + endpoint.address[1:] if endpoint.address.startswith("@") else endpoint.address
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAIT_S)
        try:
            sock.connect(target)
        except OSError as exc:
            return Finding(endpoint, UNREACHABLE, f"connect: {exc.strerror or exc}")
        return Finding(endpoint, *_classify(sock))


def probe(endpoints, uid: int, gid: int) -> list[Finding]:
    """Try every endpoint as user ``uid``/``gid``: in a forked child that drops root first, one
    child per endpoint (joining a namespace cannot be undone)."""
    findings = []
    for endpoint in endpoints:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become the other user, try, write the verdict, leave
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                found = try_endpoint(endpoint)
                os.write(write, json.dumps([found.verdict, found.detail]).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read()
        os.waitpid(pid, 0)
        verdict, detail = json.loads(answer) if answer else (UNREACHABLE, "the probe failed")
        findings.append(Finding(endpoint, verdict, detail))
    return findings


def exposure(pids, uid: int, gid: int) -> list[Finding]:
    """``probe(listeners(pids), uid, gid)``: what user ``uid`` can reach of these processes."""
    return probe(listeners(pids), uid, gid)


def counts(findings) -> dict[str, int]:
    return {verdict: sum(f.verdict == verdict for f in findings) for verdict in VERDICTS}


def table(findings) -> str:
    """One line per endpoint, for an assertion message or a report."""
    return "\n".join(f"{f.verdict:12} {f.endpoint}  {f.detail}" for f in findings) or "(no listeners)"


def as_json(findings) -> str:
    return json.dumps([{**asdict(f.endpoint), "verdict": f.verdict, "detail": f.detail} for f in findings])


if __name__ == "__main__":  # python tests/exposure.py UID GID PID...: the table, then the counts
    uid, gid, *pids = map(int, sys.argv[1:])
    result = exposure(pids, uid, gid)
    print(table(result))
    print(counts(result))
