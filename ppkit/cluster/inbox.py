"""The controller's inbox: what every connection says, in one queue, read by one loop.

Each connection (a worker, the fork server, a remote agent) has a reader thread that only puts
``Item``s in the queue; everything else happens in the thread that called ``start``/``run``, so
output lands in the right notebook cell. ``Inbox.next`` is the one polling loop: it hands routine
items (output, exit reports) to the cluster's ``routine`` function and returns the rest.

Nobody reads between two cells, and a rank may print meanwhile (a thread that logs in a loop), so
queued output is bounded: beyond ``MAX_OUTPUT_CHARS`` a rank's output goes to a file instead
(output/logfiles.py), and a note in its place says how much and where. Every other message is kept,
whatever the queue holds.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from ppkit.transport.messages import Output

FORK_SERVER = "fork server"  # the source of the local fork server's items (agents use their names)
MAX_OUTPUT_CHARS = 4_000_000  # of queued output, all ranks together


@dataclass(frozen=True)
class Closed:
    """A connection closed: its process exited, or the network between the machines failed."""


@dataclass(frozen=True)
class LaunchFailed:
    """A launcher gave up on ``rank`` (its agent was refused or went away; None: on every rank, the
    fork server never came); ``reason`` says why."""
    rank: int | None
    reason: str


@dataclass(frozen=True)
class Item:
    """``msg`` (a transport message, ``Closed`` or ``LaunchFailed``) from ``source``: a rank, or
    a launcher's process (``FORK_SERVER``, an agent's name). ``generation`` is the worker
    generation a rank's item belongs to (``restart()`` starts a new one); None for launchers."""
    source: int | str
    msg: object
    generation: int | None = None

    @property
    def from_launcher(self) -> bool:
        return self.generation is None


class Inbox:
    def __init__(self, routine, max_output_chars: int | None = None, output=None):
        self._queue: queue.Queue[Item] = queue.Queue()
        self._routine = routine  # routine(item) -> True if it dealt with the item
        self.max_output_chars = MAX_OUTPUT_CHARS if max_output_chars is None else max_output_chars
        self._output = output  # the RankPrinter: its files (written here, in order) and tick() when idle
        self._lock = threading.Lock()  # guards the two below (readers put, the caller takes)
        self._output_chars = 0  # queued now
        self._dropped: dict = {}  # source -> [chars not queued, the latest one's generation, {files}]
        self.last_put = time.monotonic()

    def put(self, item: Item) -> None:
        self.last_put = time.monotonic()  # a run's last sign of life (hang_watch.py)
        if isinstance(item.msg, Output):
            logs = self._output.logs if self._output is not None and isinstance(item.source, int) else None
            kept = logs.write(item.source, item.msg.stream, item.msg.text) if logs else None
            with self._lock:
                size = len(item.msg.text)
                if self._output_chars + size > self.max_output_chars:
                    if logs and not kept:
                        kept = logs.spill(item.source, item.msg.stream, item.msg.text)
                    dropped = self._dropped.setdefault(item.source, [0, None, set()])
                    dropped[0] += size
                    dropped[1] = item.generation
                    dropped[2].add(kept)
                    return
                if item.source in self._dropped:  # room again: say what is missing, in its place
                    self._queue.put(self._note(item.source))
                self._output_chars += size
        self._queue.put(item)

    def _note(self, source) -> Item:
        chars, generation, files = self._dropped.pop(source)
        where = " and ".join(sorted(f for f in files if f))
        text = (f"[ppkit: {chars} characters of this rank's output are not shown here but in {where}: it "
                if where else f"[ppkit: {chars} characters of output were dropped here: this rank ")
        text += (f"printed faster than the notebook read it (more than {self.max_output_chars} waiting). "
                 "Print less, or return the data from the job.]\n")
        self._output_chars += len(text)
        return Item(source, Output("stderr", text), generation)

    def _took(self, item: Item) -> None:
        if isinstance(item.msg, Output):
            with self._lock:
                self._output_chars -= len(item.msg.text)

    def _notes(self) -> list[Item]:
        """Notes for output dropped with nothing queued after it (the rank stopped printing)."""
        with self._lock:
            return [self._note(source) for source in list(self._dropped)] if self._dropped else []

    def read(self, conn, source, generation: int | None = None) -> None:
        """Queue everything ``conn`` sends until it closes (runs in the connection's thread)."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError, TypeError):  # TypeError: another thread closed ``conn``
                self.put(Item(source, Closed(), generation))
                return
            self.put(Item(source, msg, generation))

    def next(self, deadline: float | None) -> Item | None:
        """The next item that is not routine; None once ``deadline`` (``time.monotonic()``) has
        passed, or, with ``deadline=None``, once nothing is queued."""
        while True:
            try:
                if deadline is None:
                    item = self._queue.get_nowait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    item = self._queue.get(timeout=min(left, 0.1))
            except queue.Empty:
                if self._output is not None:
                    self._output.tick()
                for note in self._notes():
                    self._queue.put(note)
                if deadline is None and self._queue.empty():
                    return None
                continue
            self._took(item)
            if not self._routine(item):
                for note in self._notes() if self._output is not None else ():  # before a result: the output
                    self._took(note)  # that went to files is named first (a cluster's routine prints it)
                    self._routine(note)
                return item

    def put_back(self, items: list[Item]) -> None:
        """Requeue items a caller took but was not waiting for, for whoever reads next."""
        for item in items:
            self.put(item)
