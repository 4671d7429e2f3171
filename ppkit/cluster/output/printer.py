"""Print what each rank writes, line by line, with a ``[rank N]`` prefix; for one run (``use``),
as its ``OutputSettings`` say: some ranks or streams left out, identical lines collapsed,
``\\r``-redrawn lines shown in place, streams kept in files."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from ppkit.cluster.output.collapse import Collapser
from ppkit.cluster.output.live import LiveLines
from ppkit.cluster.output.logfiles import RankLogs
from ppkit.cluster.output.metrics_board import MetricsBoard
from ppkit.cluster.output.settings import PLAIN, STREAMS, OutputSettings

FLUSH_S = 0.25  # the most often the cell's streams are flushed while ranks print (ipykernel: 0.2 s)


def current(text: str) -> str:
    """What a line redrawn with ``\\r`` shows now: its last non-empty part."""
    parts = [part for part in text.split("\r") if part]
    return parts[-1] if parts else ""


class RankPrinter:
    def __init__(self, labels: list[str] | None = None, world_size: int = 0):
        self._partial: dict[tuple[int, str], str] = {}
        self._labels = labels
        self._world_size = world_size
        self._settings = PLAIN
        self._collapser: Collapser | None = None
        self._live = LiveLines()
        self.logs = RankLogs()  # written by the inbox's reader threads (inbox.py)
        self.metrics = MetricsBoard()  # what ranks report with ppkit.log_metrics: a live plot under the cell
        self._unflushed: set = set()  # sys.stdout / sys.stderr, written since their last flush
        self._flushed_at = 0.0

    @contextmanager
    def use(self, settings: OutputSettings | None):
        """One run's output as ``settings`` say (None: ``PLAIN``); as before once it ends."""
        settings = settings or PLAIN
        self.flush()
        self._settings = settings
        shown = [r for r in range(self._world_size) if any(settings.shown(r, s) for s in STREAMS)]
        self._collapser = Collapser(shown) if settings.collapse else None
        where = self.logs.start(settings)
        if where:
            print(f"[ppkit] each rank's output is also written to {where}/attempt_0/<rank>/", flush=True)
        try:
            yield
        finally:
            self.flush()
            self.logs.end()
            self._settings, self._collapser = PLAIN, None

    def write(self, rank: int, stream: str, text: str) -> None:
        key = (rank, stream)
        text = self._partial.pop(key, "") + text
        *lines, rest = text.split("\n")
        settings = self._settings
        if rest:
            # a redrawn line keeps only what it shows now: a progress bar's thousand redraws cost nothing
            self._partial[key] = "\r" + current(rest) if "\r" in rest else rest
        if not settings.shown(rank, stream):
            return
        if not (settings.live or settings.collapse or settings.prefix):  # cluster.run's lines, as they come
            if lines:
                label = settings.label([rank], self._labels)
                self._print(stream, "".join(f"{label}{line}\n" for line in lines))
            return
        now = time.monotonic()
        shown: list[tuple] = []
        for line in lines:
            redrawn = "\r" in line
            line = current(line) if redrawn else line
            if key in self._live:
                self._emit(shown)
                shown = []
                self._live.end(key, settings.label([rank], self._labels) + line)
            elif self._collapser is not None:
                self._collapser.add(rank, stream, line, now, redrawn=redrawn)
            else:
                shown.append((stream, line, [rank]))
        if self._collapser is not None:
            shown += self._collapser.ready(now)  # once the whole chunk is in: a rank's next lines say more
        if settings.live and "\r" in rest:
            if self._collapser is not None:
                shown += self._collapser.through(rank)  # its earlier lines first
            self._emit(shown)
            shown = []
            self._live.update(key, stream, settings.label([rank], self._labels) + current(rest), now)
        self._emit(shown)

    def tick(self) -> None:
        """Nothing arrived for a moment (inbox.py): show the lines that waited long enough."""
        if self._collapser is not None:
            self._emit(self._collapser.ready())
        self._flush_streams()
        self._live.tick()
        self.metrics.tick()

    def flush(self) -> None:
        """Everything ranks wrote, a half-written line ended as a line: the run is over."""
        self._end_partial_lines(lambda rank: True)
        self._flush_shown()

    def interject(self, rank: int | None = None) -> None:
        """Show what ranks wrote so far, before ppkit prints a message while the run goes on (a rank stopped at a
        breakpoint). ``rank``'s half-written line is ended (it comes before that rank's prompt); other ranks' stay
        open, so a line whose pieces arrive apart is not cut in two around the message."""
        self._end_partial_lines(lambda r: r == rank)
        self._flush_shown()

    def _end_partial_lines(self, which) -> None:
        ending = {key: rest for key, rest in self._partial.items() if which(key[0])}
        for key in ending:  # write() would prepend it a second time
            del self._partial[key]
        for (rank, stream), rest in sorted(ending.items()):
            self.write(rank, stream, rest + "\n")

    def _flush_shown(self) -> None:
        if self._collapser is not None:
            self._emit(self._collapser.flush())
        self._flush_streams()
        self._live.end_all()

    def _emit(self, lines: list[tuple]) -> None:
        """``(stream, text, ranks)`` lines, in order, each stream's run of lines in one write."""
        chunk, chunk_stream = [], None
        for stream, text, ranks in lines:
            if stream != chunk_stream and chunk:
                self._print(chunk_stream, "".join(chunk))
                chunk = []
            chunk_stream = stream
            chunk.append(f"{self._settings.label(ranks, self._labels)}{text}\n")
        if chunk:
            self._print(chunk_stream, "".join(chunk))

    def _print(self, stream: str, text: str) -> None:
        """Write now; flush at most every ``FLUSH_S`` (``tick`` and ``flush`` flush the rest). In a kernel
        each flush is a message to the front end that the kernel waits for: one per line, at 200 lines a
        second, took a third of a core from the ranks (docs/benchmarks.md)."""
        out = sys.stderr if stream == "stderr" else sys.stdout
        if self._unflushed and out not in self._unflushed:  # the other stream's lines first, in their order
            self._flush_streams()
        out.write(text)
        self._unflushed.add(out)
        if time.monotonic() - self._flushed_at >= FLUSH_S:
            self._flush_streams()

    def _flush_streams(self) -> None:
        for out in self._unflushed:
            out.flush()
        self._unflushed.clear()
        self._flushed_at = time.monotonic()
