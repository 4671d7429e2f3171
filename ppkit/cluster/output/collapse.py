"""Lines from several ranks shown once with the ranks that printed them: the same line as
``[ranks 0-3] epoch 1 loss 2.31`` (the collapsing that PyTorch's RFC #162999 asks of torchrun, and
that Monarch does over a time window), and lines that differ only in their numbers as one line that
says where they differ, ``[ranks 0-7] step 10 loss 2.31…2.35 (rank 5: 2.91)`` (fold.py).

Each rank's lines wait in a queue of their own, so each rank's order is kept. A line at the head of
its rank's queue leaves, with the lines of its shape (fold.py: its text without its numbers) at the
head of other ranks' queues, once every shown rank has one there, or once no other rank can still
print one next (its queue holds other lines and none of this shape), or at the latest ``WINDOW_S``
after it was printed. A line redrawn with ``\\r`` (tqdm's) leaves only with the same line.

Folding is a convenience and never loses a line: where it fails on a line (a bug, an input nobody foresaw),
the lines are shown as each rank wrote them.
"""

from __future__ import annotations

import time
from collections import Counter, deque

from ppkit.cluster.output import fold

WINDOW_S = 0.5  # the longest a line waits for lines of its shape from other ranks
MAX_PENDING = 10_000  # lines waiting at once; beyond, the oldest leave without waiting
MAX_LABELS = 100_000  # a rank's counted lines remembered (fold's ``first``); beyond, its lines name no rank


class Collapser:
    """``add`` the lines as they arrive (all of one chunk, then ask), ``ready`` (and ``through``,
    ``flush``) hand back ``(stream, text, ranks)`` in the order they are to be shown."""

    def __init__(self, ranks: list[int], window_s: float | None = None):
        self._expected = set(ranks)
        self._window_s = WINDOW_S if window_s is None else window_s
        self._queues: dict[int, deque] = {rank: deque() for rank in ranks}  # rank -> (stream, shape, text, since)
        self._waiting: dict[int, Counter] = {rank: Counter() for rank in ranks}  # rank -> (stream, shape) queued
        self._count = 0
        self._labels: dict[int, set] = {}  # rank -> hashes of (stream, shape, counters' values) it has written

    def add(self, rank: int, stream: str, text: str, now: float, redrawn: bool = False) -> None:
        """``redrawn``: the line was drawn with ``\\r`` (a progress bar): it leaves only with the same line."""
        shape = fold.exact(text) if redrawn else _shape(text)
        first = self._first(rank, (stream, shape, _counters(shape, text)))
        self._queues.setdefault(rank, deque()).append((stream, shape, text, now, first))
        self._waiting.setdefault(rank, Counter())[stream, shape] += 1
        self._count += 1

    def ready(self, now: float | None = None, force: bool = False) -> list[tuple]:
        """The lines that may be shown now (``force``: every line, in an order that keeps each rank's)."""
        now = time.monotonic() if now is None else now
        out = []
        while True:
            heads: dict[tuple, list] = {}  # (stream, shape) -> [ranks with one first, its earliest time]
            for rank, queue in self._queues.items():
                if queue:
                    stream, shape, _, since, _ = queue[0]
                    head = heads.setdefault((stream, shape), [[], since])
                    head[0].append(rank)
                    head[1] = min(head[1], since)
            leaving = next((key for key, (ranks, since) in sorted(heads.items(), key=lambda kv: kv[1][1])
                            if force or self._done(key, ranks, now - since)), None)
            if leaving is None:
                return out
            out += self._pop(leaving, heads[leaving][0])

    def through(self, rank: int) -> list[tuple]:
        """Every line of ``rank`` at once, with what must come first (it is about to show something else)."""
        out = []
        while self._queues.get(rank):  # its first line leaves with the ranks that have the same line first
            key = self._queues[rank][0][:2]
            out += self._pop(key, [r for r, queue in self._queues.items() if queue and queue[0][:2] == key])
        return out

    def flush(self) -> list[tuple]:
        return self.ready(force=True)

    def _first(self, rank: int, label: tuple) -> bool:
        """The line is the first of ``rank``'s with this label: its stream, its shape, its counters' values.
        A hash that collides, or a rank past ``MAX_LABELS``, makes it not the first: then no rank is named."""
        if not label[2]:
            return False  # no counter on the line: nothing says which point of the program it is
        seen = self._labels.setdefault(rank, set())
        if hash(label) in seen or len(seen) >= MAX_LABELS:
            return False
        seen.add(hash(label))
        return True

    def _done(self, key: tuple, ranks: list[int], age: float) -> bool:
        if age >= self._window_s or self._count > MAX_PENDING:
            return True
        return all(rank in ranks or (self._queues.get(rank) and not self._waiting[rank][key])
                   for rank in self._expected)

    def _pop(self, key: tuple, ranks: list[int]) -> list[tuple]:
        """The head lines of ``ranks`` (all of ``key``), folded: one line, or several where folding would blur
        which rank wrote what (fold.py)."""
        lines, first = [], True
        for rank in sorted(ranks):
            _, _, text, _, its_first = self._queues[rank].popleft()
            lines.append((rank, text))
            first &= its_first
            self._waiting[rank][key] -= 1
            if not self._waiting[rank][key]:
                del self._waiting[rank][key]
        self._count -= len(ranks)
        return [(key[0], text, folded) for folded, text in _fold(lines, first)]


def _shape(text: str) -> tuple[str, str]:
    try:
        return fold.shape(text)
    except Exception:  # noqa: BLE001 - folding must never cost a line: this one folds only with itself
        return fold.exact(text)


def _counters(shape: tuple[str, str], text: str) -> tuple[str, ...]:
    try:
        return fold.counters(text) if shape[0] == "#" else ()
    except Exception:  # noqa: BLE001 - folding must never cost a line: this one names no rank
        return ()


def _fold(lines: list[tuple[int, str]], first: bool) -> list[tuple[list[int], str]]:
    """fold.fold, or where it fails, each rank's line as it wrote it (the same text of several ranks once)."""
    try:
        return fold.fold(lines, first=first)
    except Exception:  # noqa: BLE001 - folding is a convenience; what the ranks wrote is the output
        same: dict[str, list[int]] = {}
        for rank, text in sorted(lines):
            same.setdefault(text, []).append(rank)
        return sorted(((ranks, text) for text, ranks in same.items()), key=lambda out: out[0][0])
