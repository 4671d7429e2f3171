"""The control channel between the notebook kernel (the controller) and its workers.

Framed pickled messages over TCP (``multiprocessing.connection``), opened by an HMAC challenge
with a random per-cluster key: a client that does not know the key is refused before any message
is read. What travels on it is defined, kind by kind, in messages.py.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from multiprocessing import connection as mpc

from ppkit.errors import AuthenticationError

KEY_ENV = "PPKIT_KEY"
HANDSHAKE_TIMEOUT_S = 10.0


def new_key() -> bytes:
    return os.urandom(32)


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    if not 1 <= int(port) <= 65535:  # the kernel would dial int(port) % 65536, another port
        raise ValueError(f"the port must be from 1 to 65535, got {port} in {text!r}")
    return host.strip("[]"), int(port)


def _set_recv_timeout(conn: mpc.Connection, seconds: float) -> None:
    """Bound blocking reads on ``conn`` (0 = no bound), without making the socket non-blocking."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        sec = int(seconds)
        usec = int((seconds - sec) * 1e6)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, usec))
    finally:
        sock.close()


class ChannelServer:
    """Accepts authenticated connections and hands each one to ``on_connect(conn)``.

    The handshake runs in its own thread with a read timeout, so a silent or wrong-key client
    can neither block other clients nor run anything.
    """

    def __init__(self, host: str, port: int, key: bytes, on_connect, on_reject=None):
        self.key = key
        self._on_connect = on_connect
        self._on_reject = on_reject
        self._listener = mpc.Listener((host, port), family="AF_INET", backlog=64)
        self.address: tuple[str, int] = self._listener.address
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="ppkit-accept", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        raw = self._listener._listener  # the unauthenticated SocketListener
        while not self._closed:
            try:
                conn = raw.accept()
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()

    def _handshake(self, conn: mpc.Connection) -> None:
        try:
            _set_recv_timeout(conn, HANDSHAKE_TIMEOUT_S)
            mpc.deliver_challenge(conn, self.key)
            mpc.answer_challenge(conn, self.key)
            _set_recv_timeout(conn, 0)
        except (mpc.AuthenticationError, OSError, EOFError) as exc:
            conn.close()
            if self._on_reject is not None:
                self._on_reject(exc)
            return
        self._on_connect(conn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # shutdown() wakes the thread blocked in accept(); close() alone does not on Linux.
            self._listener._listener._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()


def connect(address: tuple[str, int], key: bytes, timeout: float = 30.0) -> mpc.Connection:
    """Connect to a controller and authenticate; raise ``AuthenticationError`` on a wrong key."""
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(None)
    conn = mpc.Connection(sock.detach())
    try:
        _set_recv_timeout(conn, HANDSHAKE_TIMEOUT_S)
        mpc.answer_challenge(conn, key)
        mpc.deliver_challenge(conn, key)
        _set_recv_timeout(conn, 0)
    except mpc.AuthenticationError as exc:
        conn.close()
        raise AuthenticationError(
            f"the controller at {address[0]}:{address[1]} refused this client's key. "
            "Use the key printed by the notebook that started the cluster (PPKIT_KEY)."
        ) from exc
    except (OSError, EOFError) as exc:
        conn.close()
        raise AuthenticationError(
            f"the controller at {address[0]}:{address[1]} closed the connection during the "
            "key check: the key is probably wrong. Use the key printed by the notebook "
            "(PPKIT_KEY)."
        ) from exc
    return conn


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
