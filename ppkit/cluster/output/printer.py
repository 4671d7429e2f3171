"""Print what each rank writes, line by line, with a ``[rank N]`` prefix."""

from __future__ import annotations

import sys


class RankPrinter:
    def __init__(self, labels: list[str] | None = None):
        self._partial: dict[tuple[int, str], str] = {}
        self._labels = labels

    def write(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        text = self._partial.pop(key, "") + text
        *lines, rest = text.split("\n")
        if rest:
            self._partial[key] = rest
        if lines:
            out = sys.stderr if stream == "stderr" else sys.stdout
            label = self._labels[rank] if self._labels else f"rank {rank}"
            out.write("".join(f"[{label}] {line}\n" for line in lines))
            out.flush()

    def flush(self) -> None:
        partial, self._partial = self._partial, {}  # write() would prepend it a second time
        for (rank, stream), rest in sorted(partial.items()):
            self.write(rank, stream, rest + "\n")
