"""Liveness of a control connection whose peer is on another machine: a heartbeat both ways.

A machine that loses power, a process that is SIGSTOPped or a network link that goes down closes
no connection, so the other end would wait in ``recv()`` forever. The controller and each remote
agent therefore send each other a ``Heartbeat`` every ``HEARTBEAT_EVERY_S`` from a thread of
their own (``Pulse``), and read with ``receive``, which gives up once nothing at all arrived for
``SILENT_AFTER_S``. Jobs run in the ranks' processes, never in these two, so a long job cannot
delay a heartbeat; and between heartbeats both threads sleep (no polling).
"""

from __future__ import annotations

import threading

from ppkit.transport.messages import Heartbeat

HEARTBEAT_EVERY_S = 2.0
SILENT_AFTER_S = 12.0  # six heartbeats missed: a loaded machine is late, not gone


class PeerSilent(Exception):
    """Nothing arrived from the peer for ``seconds`` seconds."""

    def __init__(self, seconds: float):
        super().__init__(f"nothing arrived for {seconds:g} s")
        self.seconds = seconds


def receive(conn, silent_after: float = SILENT_AFTER_S):
    """The next message on ``conn`` that is not a ``Heartbeat``.

    Raises ``PeerSilent`` once nothing at all arrived for ``silent_after`` seconds, and what
    ``conn.recv()`` raises (``EOFError``, ``OSError``) when the connection closes.
    """
    while True:
        if not conn.poll(silent_after):
            raise PeerSilent(silent_after)
        msg = conn.recv()
        if not isinstance(msg, Heartbeat):
            return msg


class Pulse:
    """Send a ``Heartbeat`` on ``conn`` every ``every`` seconds, holding ``lock`` (the lock that
    guards every send on ``conn``), until ``stop()`` or until a send fails; ``beating=False``
    sends none (a peer that would not understand them) but still closes ``conn`` safely.
    """

    def __init__(self, conn, lock, every: float = HEARTBEAT_EVERY_S, beating: bool = True):
        self.conn, self.lock, self.every = conn, lock, every
        self._stopped = threading.Event()
        if beating:
            threading.Thread(target=self._beat, name="ppkit-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._stopped.wait(self.every):
            with self.lock:
                if self._stopped.is_set():
                    return
                try:
                    self.conn.send(Heartbeat())
                except Exception:  # noqa: BLE001 - closed or broken: the reader reports it
                    return

    def stop(self) -> None:
        self._stopped.set()

    def close(self) -> None:
        """Stop, then close ``conn`` holding ``lock``: no heartbeat can then be written to a
        descriptor that was closed and reused by another connection."""
        self.stop()
        with self.lock:
            self.conn.close()
