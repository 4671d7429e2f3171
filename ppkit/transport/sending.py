"""Send one message to several connections within a deadline, and give way to Ctrl-C.

``conn.send`` blocks until the peer has read enough: to a process that reads nothing (stopped
with SIGSTOP or Ctrl-Z, or a machine that stopped answering) a large message blocks for ever,
whatever the job's timeout, and a Ctrl-C that breaks into it leaves half a message on the
connection. Here the message is pickled once, framed as ``multiprocessing.connection`` frames it
(so the peer's ``conn.recv()`` reads it as usual), and written with non-blocking sends whenever a
socket has room. The deadline holds, a KeyboardInterrupt can only come between two writes, and
afterwards ``complete``/``partial`` say exactly which connections got the whole message and which
got only a part (those are unusable: the caller closes them).
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from multiprocessing.reduction import ForkingPickler

from ppkit.transport import channel

CHUNK = 1 << 20
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)  # 0 on Windows: there a send blocks as before


def frame(body) -> tuple[bytes, memoryview]:
    """The header and body ``Connection.send_bytes(body)`` would write (a small one all in the
    header: one write, as there, so Nagle's algorithm never holds back a lone second segment)."""
    n = len(body)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return (header + bytes(body), memoryview(b"")) if n <= 16384 else (header, body)


class Broadcast:
    """``msg`` to every connection of ``conns`` (key -> Connection; None: already gone)."""

    def __init__(self, conns: dict, msg):
        self._pickled = ForkingPickler.dumps(msg)
        self._header, self._body = frame(self._pickled)
        self.size = len(self._header) + len(self._body)
        self._conns = conns
        self.sent = {key: 0 for key in conns}  # bytes written so far, per connection
        self.gone = {key for key, conn in conns.items() if conn is None}  # closed or broken

    @property
    def complete(self) -> list:
        return [k for k, n in self.sent.items() if n == self.size and k not in self.gone]

    @property
    def unsent(self) -> list:
        """Connections that still miss all or part of the message (and are not gone)."""
        return [k for k, n in self.sent.items() if n < self.size and k not in self.gone]

    @property
    def partial(self) -> list:
        """Connections left with part of a message: only closing them makes them safe."""
        return [k for k in self.sent if 0 < self.sent[k] < self.size]

    def send(self, deadline: float) -> None:
        """Write until every connection has the message or is gone, or ``time.monotonic()`` passes
        ``deadline``. A KeyboardInterrupt propagates, with ``sent`` up to date."""
        if not _DONTWAIT:
            for key in self.unsent:
                try:
                    self._conns[key].send_bytes(self._pickled)
                    self.sent[key] = self.size
                except OSError:
                    self.gone.add(key)
            return
        socks, selector = {}, None
        try:
            for key in self.unsent:
                try:
                    socks[key] = socket.socket(fileno=self._conns[key].fileno())
                except OSError:  # closed already
                    self.gone.add(key)
            for key in socks:
                self._write(key, socks[key])
            while self.unsent and (left := deadline - time.monotonic()) > 0:
                if selector is None:
                    selector = selectors.DefaultSelector()
                    for key in self.unsent:
                        selector.register(socks[key], selectors.EVENT_WRITE, key)
                for event, _ in selector.select(min(left, 1.0)):
                    self._write(event.data, socks[event.data])
                    if event.data not in self.unsent:
                        selector.unregister(socks[event.data])
        finally:
            if selector is not None:
                selector.close()
            for sock in socks.values():
                sock.detach()  # the descriptor stays the connection's

    def _write(self, key, sock: socket.socket) -> None:
        """As much as fits now."""
        while self.sent[key] < self.size:
            at, head = self.sent[key], len(self._header)
            view = (memoryview(self._header)[at:] if at < head
                    else self._body[at - head:at - head + CHUNK])
            try:
                self.sent[key] = at + sock.send(view, _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the peer is gone (EPIPE, ECONNRESET)
                self.gone.add(key)
                return


def send_within(conn, msg, seconds: float) -> bool:
    """``conn.send(msg)`` that gives up after ``seconds``; False then, or if ``conn`` is None or
    gone. A connection left with part of the message is shut (its reader sees EOF)."""
    sending = Broadcast({0: conn}, msg)
    try:
        sending.send(time.monotonic() + seconds)
    finally:
        if sending.partial:
            channel.wake_reader(conn)
    return bool(sending.complete)
