"""The control channel between the notebook kernel (the controller) and its workers.

Framed pickled messages over TCP (``multiprocessing.connection``), opened by an HMAC challenge
with a random per-cluster key: a client that does not know the key is refused before any message
is read. What travels on it is defined, kind by kind, in messages.py.

The listening side must survive strangers on the network (README, "Security"): at most
``MAX_HANDSHAKES`` key checks run at once (a connection beyond them is closed at once, before its
challenge, and a client that sees that retries), each key check ends within
``HANDSHAKE_TIMEOUT_S`` however slowly the peer trickles its bytes, and the accept loop outlives
running out of file descriptors or threads: only ``close()`` ends it.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from multiprocessing import connection as mpc

from ppkit.errors import AuthenticationError

KEY_ENV = "PPKIT_KEY"
HANDSHAKE_TIMEOUT_S = 10.0  # the whole key check, not each read
MAX_HANDSHAKES = 16  # key checks in progress at once; beyond that a connection is closed at once
ACCEPT_BACKOFF_S = 0.1  # after accept() or a thread start failed (EMFILE, ENFILE, no threads left)
BUSY_RETRY_S = 0.25  # a client's pause before it tries a busy controller again


class ChannelBusy(ConnectionError):
    """The controller closed the connection before its challenge: its key-check slots were taken."""


def new_key() -> bytes:
    return os.urandom(32)


UNIX_PREFIX = "unix:"  # PPKIT_ADDR for a Unix socket: "unix:/tmp/ppkit-x/control.sock"


def parse_address(text: str) -> tuple[str, int] | str:
    """``HOST:PORT`` as (host, port), or ``unix:PATH`` as the socket's path."""
    if text.startswith(UNIX_PREFIX) and text[len(UNIX_PREFIX):]:
        return text[len(UNIX_PREFIX):]
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not 1 <= int(port) <= 65535:  # the kernel would dial int(port) % 65536, another port
        raise ValueError(f"the port must be from 1 to 65535, got {port} in {text!r}")
    return host.strip("[]"), int(port)


def format_address(address: tuple[str, int] | str) -> str:
    """What ``parse_address`` reads back: ``HOST:PORT``, or ``unix:PATH`` for a Unix socket's path."""
    return UNIX_PREFIX + address if isinstance(address, str) else f"{address[0]}:{address[1]}"


def describe(address: tuple[str, int] | str) -> str:
    return f"the Unix socket {address}" if isinstance(address, str) else f"{address[0]}:{address[1]}"


class _KeyCheck:
    """A socket as ``multiprocessing.connection``'s challenge functions use it (``send_bytes``,
    ``recv_bytes``, the same framing), with one deadline for the whole exchange: a per-read
    timeout would let a peer that sends a byte every few seconds hold the check for minutes."""

    def __init__(self, sock: socket.socket, seconds: float):
        # Small messages go at once: with Nagle's algorithm one that follows another still unanswered
        # (the key check's last word, then a worker's hello) waits for the peer's delayed ACK, 40 ms.
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.seconds = sock, seconds
        self.deadline = time.monotonic() + seconds
        self.received = 0

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the key check did not finish within {self.seconds:g} s")
        return left

    def send_bytes(self, data: bytes) -> None:
        self.sock.settimeout(self._left())
        self.sock.sendall(struct.pack("!i", len(data)) + data)

    def recv_bytes(self, maxlength: int) -> bytes:
        size, = struct.unpack("!i", self._read(4))
        if not 0 <= size <= maxlength:
            raise OSError(f"bad message length {size} in the key check")
        return self._read(size)

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            self.sock.settimeout(self._left())
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                if self.received == 0:  # closed before its challenge: a controller with no free slot
                    raise ChannelBusy("the controller closed the connection before its key check")
                raise EOFError("the peer closed the connection during the key check")
            data += chunk
            self.received += len(chunk)
        return data

    def connection(self) -> mpc.Connection:
        """The checked socket as a blocking ``Connection`` (it owns the descriptor from now on)."""
        self.sock.settimeout(None)
        return mpc.Connection(self.sock.detach())


def _start_thread(target, *args) -> None:
    """A daemon thread (a function of its own so tests can make it fail like a full system)."""
    threading.Thread(target=target, args=args, name="ppkit-conn", daemon=True).start()


class ChannelServer:
    """Accepts authenticated connections and hands each one to ``on_connect(conn)``, in the
    thread that checked its key (that thread is then the connection's own).

    A client that fails the key check, times out, or finds every key-check slot taken is closed
    and reported to ``on_reject(exc)``; ``rejected`` counts them, ``accept_failures`` the times
    ``accept()`` itself failed (no file descriptor left). ``unix_path``: listen on a Unix socket
    there instead of on ``host:port`` (made readable and writable by this user only).
    """

    def __init__(self, host: str, port: int, key: bytes, on_connect, on_reject=None,
                 unix_path: str | None = None):
        self.key = key
        self._on_connect = on_connect
        self._on_reject = on_reject
        if unix_path is None:
            self._sock = socket.create_server((host, port), family=socket.AF_INET, backlog=64)
            self.address: tuple[str, int] | str = self._sock.getsockname()[:2]
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.bind(unix_path)
            os.chmod(unix_path, 0o600)
            self._sock.listen(64)
            self.address = unix_path
        self._slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._count_lock = threading.Lock()
        self.rejected = self.accept_failures = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="ppkit-accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:  # EMFILE, ENFILE, ENOBUFS, ECONNABORTED ...: wait a little, go on
                if self._closed.is_set():
                    return
                self.accept_failures += 1  # only this thread writes it
                self._closed.wait(ACCEPT_BACKOFF_S)
                continue
            if not self._slots.acquire(blocking=False):
                sock.close()
                self._reject(ChannelBusy(f"{MAX_HANDSHAKES} key checks were already in progress"))
                continue
            try:
                _start_thread(self._handshake, sock)
            except RuntimeError as exc:  # "can't start new thread"
                self._slots.release()
                sock.close()
                self._reject(exc)
                self._closed.wait(ACCEPT_BACKOFF_S)

    def _handshake(self, sock: socket.socket) -> None:
        try:
            check = _KeyCheck(sock, HANDSHAKE_TIMEOUT_S)
            mpc.deliver_challenge(check, self.key)
            mpc.answer_challenge(check, self.key)
            conn = check.connection()
        except (mpc.AuthenticationError, OSError, EOFError, AssertionError) as exc:
            sock.close()
            self._reject(exc)
            return
        finally:
            self._slots.release()
        self._on_connect(conn)

    def _reject(self, exc: BaseException) -> None:
        with self._count_lock:
            self.rejected += 1
        if self._on_reject is not None:
            try:
                self._on_reject(exc)
            except Exception:  # noqa: BLE001 - a reporting hook must not end the accept loop
                pass

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def connect(address: tuple[str, int] | str, key: bytes, timeout: float = 30.0) -> mpc.Connection:
    """Connect to a controller and authenticate; raise ``AuthenticationError`` on a wrong key.

    A controller whose key-check slots are all taken closes the connection before its challenge;
    this retries that until ``timeout``, then raises ``ChannelBusy`` (an ``OSError``).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _connect_once(address, key, max(0.5, deadline - time.monotonic()))
        except ChannelBusy as exc:
            if time.monotonic() + BUSY_RETRY_S >= deadline:
                raise ChannelBusy(
                    f"the controller at {describe(address)} kept closing new connections before "
                    f"their key check for {timeout:g} s: all of its {MAX_HANDSHAKES} key-check slots "
                    "stayed taken (a flood of connections from elsewhere on the network?)") from exc
            time.sleep(BUSY_RETRY_S)


def _open(address: tuple[str, int] | str, timeout: float) -> socket.socket:
    if not isinstance(address, str):
        return socket.create_connection(address, timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock


def _connect_once(address: tuple[str, int] | str, key: bytes, timeout: float) -> mpc.Connection:
    sock = _open(address, timeout)
    check = _KeyCheck(sock, HANDSHAKE_TIMEOUT_S)
    try:
        mpc.answer_challenge(check, key)
        mpc.deliver_challenge(check, key)
        return check.connection()
    except ChannelBusy:
        sock.close()
        raise
    except TimeoutError as exc:
        sock.close()
        raise TimeoutError(
            f"the controller at {describe(address)} did not finish the key check within "
            f"{HANDSHAKE_TIMEOUT_S:g} s: it is frozen, overloaded, or not a ppkit controller.") from exc
    except mpc.AuthenticationError as exc:
        sock.close()
        raise AuthenticationError(
            f"the controller at {describe(address)} refused this client's key. "
            "Use the key printed by the notebook that started the cluster (PPKIT_KEY)."
        ) from exc
    except (OSError, EOFError, AssertionError) as exc:
        sock.close()
        raise AuthenticationError(
            f"the controller at {describe(address)} closed the connection during the "
            "key check: the key is probably wrong. Use the key printed by the notebook "
            "(PPKIT_KEY)."
        ) from exc


def wake_reader(conn) -> None:
    """Make a thread blocked in ``conn.recv()`` return (EOF) without closing its descriptor."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()
