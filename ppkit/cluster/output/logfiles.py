"""Each rank's output in files: the streams a run logs (torchrun's ``--tee``/``--redirects`` with
``--log-dir``), and output the cell could not take in time (beyond the inbox's limit), which is
never dropped.

torchrun's layout: ``<log_dir>/<run_id>_<random>/attempt_0/<rank>/stdout.log`` (and ``stderr.log``);
the folder is named by the global rank, which is the local rank on one node. Output beyond the
inbox's limit goes to the same file where the stream is logged, else to ``overflow/<rank>/<stream>.log``
in a folder of its own (``ppkit-output-*`` in the temporary folder, one per cluster).

``write`` and ``spill`` run in the connections' reader threads (inbox.py), so that a file holds a
rank's output in the order it was printed; ``start`` and ``end`` in the caller's thread.
"""

from __future__ import annotations

import os
import tempfile
import threading

from ppkit.cluster.output.settings import PLAIN, OutputSettings


class RankLogs:
    def __init__(self):
        self._lock = threading.Lock()
        self._settings = PLAIN
        self._files: dict[tuple[int, str], object] = {}  # (rank, stream) -> open file of this run
        self._run_dir: str | None = None
        self._overflow_dir: str | None = None  # made on the first overflow, kept for the cluster's life

    def start(self, settings: OutputSettings) -> str | None:
        """Open one run's files; returns the run's folder (None: it logs nothing)."""
        with self._lock:
            self._close_files()
            self._settings, self._run_dir = settings, None
            if settings.logged:
                base = settings.log_dir or tempfile.mkdtemp(prefix="torchelastic_")  # torchrun's own default
                os.makedirs(base, exist_ok=True)
                self._run_dir = tempfile.mkdtemp(prefix=f"{settings.run_id}_", dir=base)
                for rank, stream in sorted(settings.logged):
                    folder = os.path.join(self._run_dir, "attempt_0", str(rank))
                    os.makedirs(folder, exist_ok=True)
                    self._files[rank, stream] = open(os.path.join(folder, f"{stream}.log"), "a",  # noqa: SIM115
                                                     encoding="utf-8", errors="replace")
            return self._run_dir

    def end(self) -> None:
        with self._lock:
            self._close_files()
            self._settings = PLAIN

    def write(self, rank: int, stream: str, text: str) -> str | None:
        """Keep ``text`` in the rank's file if this run logs that stream; the file's path, else None."""
        if not self._files:  # the common case, without the lock
            return None
        with self._lock:
            file = self._files.get((rank, stream))
            if file is None:
                return None
            file.write(text)
            file.flush()
            return file.name

    def spill(self, rank: int, stream: str, text: str) -> str:
        """``text`` that the cell cannot take now, in a file; where it went."""
        with self._lock:
            if self._overflow_dir is None:
                self._overflow_dir = tempfile.mkdtemp(prefix="ppkit-output-")
            folder = os.path.join(self._overflow_dir, "overflow", str(rank))
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{stream}.log")
            with open(path, "a", encoding="utf-8", errors="replace") as file:
                file.write(text)
            return path

    def _close_files(self) -> None:
        for file in self._files.values():
            file.close()
        self._files = {}
