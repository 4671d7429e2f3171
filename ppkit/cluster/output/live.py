"""Lines that a rank redraws with ``\\r`` (tqdm's progress bars), shown in place, one per rank and
stream, as they change.

In a Jupyter kernel (JupyterLab, the classic notebook) each is a display of its own, updated through
its ``display_id``, at most every ``EVERY_S`` seconds; on a terminal (IPython outside a kernel, a
script) the line is redrawn after a ``\\r``. When the rank ends the line (``\\n``), its last state
stays where it was drawn.
"""

from __future__ import annotations

import sys
import time
import uuid

EVERY_S = 0.2  # the most often one line is redrawn


def in_kernel() -> bool:
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and hasattr(shell, "kernel")


class LiveLines:
    def __init__(self, every_s: float = EVERY_S):
        self._every_s = every_s
        self._lines: dict[tuple, list] = {}  # key -> [display id, text shown, text now, when shown]
        self._kernel = None  # decided at the first line: the cell's kernel, or a terminal

    def __contains__(self, key) -> bool:
        return key in self._lines

    def update(self, key, stream: str, text: str, now: float | None = None) -> None:
        """``key``'s line now reads ``text`` (its prefix included)."""
        now = time.monotonic() if now is None else now
        line = self._lines.get(key)
        if line is None:
            if self._kernel is None:
                self._kernel = in_kernel()
            line = self._lines[key] = [f"ppkit-{uuid.uuid4().hex}", None, text, 0.0, stream]
        line[2] = text
        if now - line[3] >= self._every_s:
            self._show(line, now)

    def tick(self, now: float | None = None) -> None:
        """Redraw the lines that changed and have waited long enough."""
        now = time.monotonic() if now is None else now
        for line in self._lines.values():
            if line[2] != line[1] and now - line[3] >= self._every_s:
                self._show(line, now)

    def end(self, key, text: str) -> None:
        """``key``'s line is done: it shows ``text`` and stays."""
        line = self._lines.pop(key)
        line[2] = text
        self._show(line, time.monotonic(), last=True)

    def end_all(self) -> None:
        for key in list(self._lines):
            self.end(key, self._lines[key][2])

    def _show(self, line: list, now: float, last: bool = False) -> None:
        display_id, shown, text, _, stream = line
        line[1], line[3] = text, now
        if self._kernel:
            from IPython.display import display, update_display

            data = {"text/plain": text}
            if shown is None:
                sys.stdout.flush()  # what was printed before comes first
                sys.stderr.flush()
                display(data, raw=True, display_id=display_id)
            elif text != shown:
                update_display(data, raw=True, display_id=display_id)
            return
        out = sys.stderr if stream == "stderr" else sys.stdout
        out.write(f"\r{text}" + ("\n" if last else ""))
        out.flush()
