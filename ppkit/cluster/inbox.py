"""The controller's inbox: what every connection says, in one queue, read by one loop.

Each connection (a worker, the fork server, a remote agent) has a reader thread that only puts
``Item``s in the queue; everything else happens in the thread that called ``start``/``run``, so
output lands in the right notebook cell. ``Inbox.next`` is the one polling loop: it hands routine
items (output, exit reports) to the cluster's ``routine`` function and returns the rest.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

FORK_SERVER = "fork server"  # the source of the local fork server's items (agents use their names)


@dataclass(frozen=True)
class Closed:
    """A connection closed: its process exited, or the network between the machines failed."""


@dataclass(frozen=True)
class LaunchFailed:
    """A launcher gave up on ``rank`` (its agent was refused or went away); ``reason`` says why."""
    rank: int
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
    def __init__(self, routine):
        self._queue: queue.Queue[Item] = queue.Queue()
        self._routine = routine  # routine(item) -> True if it dealt with the item

    def put(self, item: Item) -> None:
        self._queue.put(item)

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
                if deadline is None:
                    return None
                continue
            if not self._routine(item):
                return item

    def put_back(self, items: list[Item]) -> None:
        """Requeue items a caller took but was not waiting for, for whoever reads next."""
        for item in items:
            self.put(item)
