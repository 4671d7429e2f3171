"""Liveness of a control connection whose peer is on another machine: a heartbeat both ways.

A machine that loses power, a process that is SIGSTOPped or a network link that goes down closes
no connection, so the other end would wait in ``recv()`` forever. The controller and each remote
agent therefore send each other a ``Heartbeat`` every ``HEARTBEAT_EVERY_S`` from a thread of
their own (``Pulse``), and read with ``receive``, which gives up once nothing at all arrived for
``SILENT_AFTER_S`` (six heartbeats). Jobs run in the ranks' processes, never in these two, so a long job cannot
delay a heartbeat; and between heartbeats both threads sleep (no polling).
"""

from __future__ import annotations

import os
import threading
import warnings

from ppkit.transport.messages import Heartbeat

SILENT_ENV = "PPKIT_SILENT_AFTER_S"  # a slower link may want more; the fault tests show the bound in less
DEFAULT_SILENT_AFTER_S = 12.0  # six heartbeats missed: a loaded machine is late, not gone


def silent_after_from(environ=os.environ) -> float:
    """``PPKIT_SILENT_AFTER_S`` (seconds, at least 1) if set, else 12; a bad value is named and ignored."""
    raw = environ.get(SILENT_ENV)
    if raw is None:
        return DEFAULT_SILENT_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 1.0:  # NaN included
        warnings.warn(f"{SILENT_ENV}={raw!r} is not a number of seconds >= 1; giving a silent peer up after "
                      f"{DEFAULT_SILENT_AFTER_S:g} s instead. Set it to e.g. 30 for a slow link, or unset it.",
                      stacklevel=2)
        return DEFAULT_SILENT_AFTER_S
    return value


SILENT_AFTER_S = silent_after_from()
HEARTBEAT_EVERY_S = SILENT_AFTER_S / 6


class PeerSilent(Exception):
    """Nothing arrived from the peer for ``seconds`` seconds."""

    def __init__(self, seconds: float):
        super().__init__(f"nothing arrived for {seconds:g} s")
        self.seconds = seconds


def receive(conn, silent_after: float | None = None):
    """The next message on ``conn`` that is not a ``Heartbeat``.

    Raises ``PeerSilent`` once nothing at all arrived for ``silent_after`` seconds (``SILENT_AFTER_S``
    by default), and what ``conn.recv()`` raises (``EOFError``, ``OSError``) when the connection closes.
    """
    silent_after = SILENT_AFTER_S if silent_after is None else silent_after
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

    def __init__(self, conn, lock, every: float | None = None, beating: bool = True):
        self.conn, self.lock, self.every = conn, lock, HEARTBEAT_EVERY_S if every is None else every
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
