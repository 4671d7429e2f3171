"""What the listening sockets of a set of processes answer: ppkit's key challenge, or anyone.

``listeners(pids)`` lists every TCP socket (IPv4 and IPv6) and every Unix socket (pathname or
abstract) those processes listen on, from /proc: the sockets a process holds (/proc/PID/fd) matched
against the tables of its own network namespace (/proc/PID/net/...), so sockets inside a private
namespace are listed too (reading another user's /proc/PID/fd needs root). ``try_endpoint`` connects
to one as this process is and sorts what happens into three verdicts:

- ``challenge``: the listener speaks first with ppkit's key check (``multiprocessing.connection``'s
  ``#CHALLENGE#`` message): nothing is read from a client that does not know the key;
- ``open``: it accepts and waits for the client's words without any challenge (torch's TCPStore,
  gloo's pairs, TensorPipe): anyone who can connect can talk to it;
- ``unreachable``: the connection cannot be made (refused, a 0700 folder, a network namespace this
  process cannot enter), or is closed at once without a word.

Nothing is sent: a probe connects, waits for the first bytes, and closes. Still, a probe is a
connection: TensorPipe's short-lived listeners take the first one that comes, so probing a running RPC
world can break it (``ppkit preflight`` only counts its listeners). tests/exposure.py runs the probe as
another Unix user.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass

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
    opening = _first_bytes(sock)
    if opening is None:
        return OPEN, f"accepted, and waited {WAIT_S:g} s for the client's words without any challenge"
    if opening[4:15] == b"#CHALLENGE#":
        return CHALLENGE, "accepted, then sent ppkit's key challenge first"
    if opening == b"":
        return UNREACHABLE, "accepted, then closed at once without a word"
    return OPEN, f"accepted and spoke first without a challenge: {opening[:20]!r}"


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


def counts(findings) -> dict[str, int]:
    return {verdict: sum(f.verdict == verdict for f in findings) for verdict in VERDICTS}

