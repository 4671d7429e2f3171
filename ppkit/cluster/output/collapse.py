"""Identical lines from several ranks, shown once with the ranks that printed them:
``[ranks 0-3] epoch 1 loss 2.31`` (the collapsing that PyTorch's RFC #162999 asks of torchrun, and
that Monarch does over a time window).

Cheap and bounded: a line waits until every shown rank printed it, or until no other rank can still
print it before its own next line, or at most ``WINDOW_S``; a line then leaves with the ones queued
before it, so that each rank's lines keep their order. Lines are compared as printed, whole.
"""

from __future__ import annotations

import time
from collections import deque

WINDOW_S = 0.5  # the longest a line waits for the same line from other ranks
MAX_PENDING = 10_000  # lines waiting at once; beyond, the oldest leave without waiting


class _Group:
    __slots__ = ("stream", "text", "ranks", "since", "place")

    def __init__(self, stream: str, text: str, rank: int, since: float, place: int):
        self.stream, self.text, self.ranks, self.since, self.place = stream, text, [rank], since, place


class Collapser:
    """``add`` lines as they arrive; ``ready`` (and ``flush``) hand back ``(stream, text, ranks)``
    in the order they are to be shown."""

    def __init__(self, ranks: list[int], window_s: float = WINDOW_S):
        self._expected = set(ranks)
        self._window_s = window_s
        self._queue: deque[_Group] = deque()
        self._open: dict[tuple[str, str], list[_Group]] = {}  # groups that ranks may still join
        self._last: dict[int, int] = {}  # each rank's latest line's place (counted from the first line)
        self._count = self._shown = 0  # lines queued and shown so far: a place below _shown has been shown

    def add(self, rank: int, stream: str, text: str, now: float | None = None) -> list[tuple]:
        now = time.monotonic() if now is None else now
        after = self._last.get(rank, -1)
        for group in self._open.get((stream, text), ()):
            if group.place > after and rank not in group.ranks:  # joining keeps the rank's order
                group.ranks.append(rank)
                self._last[rank] = group.place
                return self.ready(now)
        group = _Group(stream, text, rank, now, self._count)
        self._count += 1
        self._queue.append(group)
        self._open.setdefault((stream, text), []).append(group)
        self._last[rank] = group.place
        return self.ready(now)

    def ready(self, now: float | None = None) -> list[tuple]:
        """The lines that may be shown now."""
        now = time.monotonic() if now is None else now
        out = []
        while self._queue and (self._done(self._queue[0], now) or len(self._queue) > MAX_PENDING):
            out.append(self._pop())
        return out

    def through(self, rank: int) -> list[tuple]:
        """Everything up to ``rank``'s latest line, at once (it is about to show something else)."""
        out = []
        while self._last.get(rank, -1) >= self._shown:
            out.append(self._pop())
        return out

    def flush(self) -> list[tuple]:
        return [self._pop() for _ in range(len(self._queue))]

    def _done(self, group: _Group, now: float) -> bool:
        if now - group.since >= self._window_s or self._expected <= set(group.ranks):
            return True
        # can another rank still print it before its own next line?
        return all(rank in group.ranks or self._last.get(rank, -1) > group.place for rank in self._expected)

    def _pop(self) -> tuple:
        group = self._queue.popleft()
        self._shown = group.place + 1
        siblings = self._open[group.stream, group.text]
        siblings.remove(group)
        if not siblings:
            del self._open[group.stream, group.text]
        return group.stream, group.text, sorted(group.ranks)
