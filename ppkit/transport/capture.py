"""A process's file descriptors 1 and 2 (Python prints and C++ logs alike), captured through
pipes and sent to the controller as ``Output`` messages, which it prints with a rank prefix."""

from __future__ import annotations

import os
import select
import threading
import time

from ppkit.transport.messages import Output

_SYNC = b"\x00ppkit-sync\x00"
BATCH_S = 0.05  # after the first bytes, how long more may gather into the same Output message
CHUNK = 65536


class OutputPipe:
    """Redirect one file descriptor into a pipe whose contents go to the controller."""

    def __init__(self, fd: int, stream: str, send):
        self.fd, self.stream, self._send = fd, stream, send
        self._synced = threading.Event()
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        threading.Thread(target=self._pump, name=f"ppkit-{stream}", daemon=True).start()

    def _pump(self) -> None:
        pending = b""
        while True:
            try:
                data = self._read_batch()
            except OSError:
                return
            if not data:
                return
            pending += data
            while _SYNC in pending:
                before, pending = pending.split(_SYNC, 1)
                if before:
                    self._send(Output(self.stream, before.decode("utf-8", "replace")))
                self._synced.set()
            # keep a tail that could be the start of a sync marker
            cut = len(pending)
            for i in range(1, len(_SYNC)):
                if pending.endswith(_SYNC[:i]):
                    cut = len(pending) - i
            if cut:
                self._send(Output(self.stream, pending[:cut].decode("utf-8", "replace")))
                pending = pending[cut:]

    def _read_batch(self) -> bytes:
        """What the rank wrote, gathered for up to ``BATCH_S`` after the first bytes: a rank that prints a
        line per step sends a message every 50 ms, not one per line (each costs the rank and the kernel CPU
        time that the training loop would otherwise have; docs/benchmarks.md). A sync marker ends the wait."""
        data = os.read(self._read_end, CHUNK)
        deadline = time.monotonic() + BATCH_S
        while data and len(data) < CHUNK and _SYNC not in data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read_end], [], [], left)[0]:
                break
            more = os.read(self._read_end, CHUNK - len(data))
            if not more:
                break
            data += more
        return data

    def sync(self, timeout: float = 2.0) -> None:
        """Return once everything written to the descriptor so far has been sent."""
        self._synced.clear()
        os.write(self.fd, _SYNC)
        self._synced.wait(timeout)
