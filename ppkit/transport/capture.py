"""A process's file descriptors 1 and 2 (Python prints and C++ logs alike), captured through
pipes and sent to the controller as ``Output`` messages, which it prints with a rank prefix."""

from __future__ import annotations

import codecs
import fcntl
import os
import select
import threading

from ppkit.transport.messages import Output

_SYNC = b"\x00ppkit-sync\x00"
BATCH_S = 0.05  # after the first bytes, how long more may gather into the same Output message
CHUNK = 65536
PIPE_BYTES = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class OutputPipe:
    """Redirect one file descriptor into a pipe whose contents go to the controller."""

    def __init__(self, fd: int, stream: str, send):
        self.fd, self.stream, self._send = fd, stream, send
        self._synced = threading.Event()
        self._wake = threading.Event()  # sync() ends the pump's gathering at once
        read_end, write_end = os.pipe()
        try:  # room for what a rank writes while the pump gathers (Linux; 64 KiB otherwise)
            fcntl.fcntl(write_end, F_SETPIPE_SZ, PIPE_BYTES)
        except (OSError, AttributeError):
            pass
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        self._decode = codecs.getincrementaldecoder("utf-8")("replace").decode  # a character split stays whole
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
                    self._send(Output(self.stream, self._decode(before)))
                self._synced.set()
            # keep a tail that could be the start of a sync marker
            cut = len(pending)
            for i in range(1, len(_SYNC)):
                if pending.endswith(_SYNC[:i]):
                    cut = len(pending) - i
            if cut:
                self._send(Output(self.stream, self._decode(pending[:cut])))
                pending = pending[cut:]

    def _read_batch(self) -> bytes:
        """What the rank wrote, gathered for ``BATCH_S`` after the first bytes: a rank that prints a line per
        step sends a message every 50 ms, not one per line. The pump sleeps meanwhile rather than wake at
        every write: each wake takes the GIL from the training loop (docs/benchmarks.md). ``sync`` wakes it."""
        data = os.read(self._read_end, CHUNK)
        if data and _SYNC not in data:
            self._wake.wait(BATCH_S)
            self._wake.clear()
            while select.select([self._read_end], [], [], 0)[0]:
                more = os.read(self._read_end, CHUNK)
                if not more:
                    break
                data += more
                if len(more) < CHUNK:
                    break
        return data

    def sync(self, timeout: float = 2.0) -> None:
        """Return once everything written to the descriptor so far has been sent."""
        self._synced.clear()
        os.write(self.fd, _SYNC)
        self._wake.set()
        self._synced.wait(timeout)
