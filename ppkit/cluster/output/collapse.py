"""Identical lines from several ranks, shown once with the ranks that printed them:
``[ranks 0-3] epoch 1 loss 2.31`` (the collapsing that PyTorch's RFC #162999 asks of torchrun, and
that Monarch does over a time window).

Each rank's lines wait in a queue of their own, so each rank's order is kept. A line at the head of
its rank's queue leaves, with the same line at the head of other ranks' queues, once every shown rank
has it there, or once no other rank can still print it next (its queue holds other lines and not
this one), or at the latest ``WINDOW_S`` after it was printed. Lines are compared whole, as printed.
"""

from __future__ import annotations

import time
from collections import Counter, deque

WINDOW_S = 0.5  # the longest a line waits for the same line from other ranks
MAX_PENDING = 10_000  # lines waiting at once; beyond, the oldest leave without waiting


class Collapser:
    """``add`` the lines as they arrive (all of one chunk, then ask), ``ready`` (and ``through``,
    ``flush``) hand back ``(stream, text, ranks)`` in the order they are to be shown."""

    def __init__(self, ranks: list[int], window_s: float = WINDOW_S):
        self._expected = set(ranks)
        self._window_s = window_s
        self._queues: dict[int, deque] = {rank: deque() for rank in ranks}  # rank -> (stream, text, since)
        self._waiting: dict[int, Counter] = {rank: Counter() for rank in ranks}  # rank -> (stream, text) queued
        self._count = 0

    def add(self, rank: int, stream: str, text: str, now: float) -> None:
        self._queues.setdefault(rank, deque()).append((stream, text, now))
        self._waiting.setdefault(rank, Counter())[stream, text] += 1
        self._count += 1

    def ready(self, now: float | None = None, force: bool = False) -> list[tuple]:
        """The lines that may be shown now (``force``: every line, in an order that keeps each rank's)."""
        now = time.monotonic() if now is None else now
        out = []
        while True:
            heads: dict[tuple, list] = {}  # (stream, text) -> [ranks with it first, its earliest time]
            for rank, queue in self._queues.items():
                if queue:
                    stream, text, since = queue[0]
                    head = heads.setdefault((stream, text), [[], since])
                    head[0].append(rank)
                    head[1] = min(head[1], since)
            leaving = next((key for key, (ranks, since) in sorted(heads.items(), key=lambda kv: kv[1][1])
                            if force or self._done(key, ranks, now - since)), None)
            if leaving is None:
                return out
            out.append(self._pop(leaving, heads[leaving][0]))

    def through(self, rank: int) -> list[tuple]:
        """Every line of ``rank`` at once, with what must come first (it is about to show something else)."""
        out = []
        while self._queues.get(rank):  # its first line leaves with the ranks that have the same line first
            key = self._queues[rank][0][:2]
            out.append(self._pop(key, [r for r, queue in self._queues.items() if queue and queue[0][:2] == key]))
        return out

    def flush(self) -> list[tuple]:
        return self.ready(force=True)

    def _done(self, key: tuple, ranks: list[int], age: float) -> bool:
        if age >= self._window_s or self._count > MAX_PENDING:
            return True
        return all(rank in ranks or (self._queues.get(rank) and not self._waiting[rank][key])
                   for rank in self._expected)

    def _pop(self, key: tuple, ranks: list[int]) -> tuple:
        for rank in ranks:
            self._queues[rank].popleft()
            self._waiting[rank][key] -= 1
            if not self._waiting[rank][key]:
                del self._waiting[rank][key]
        self._count -= len(ranks)
        return key[0], key[1], sorted(ranks)
