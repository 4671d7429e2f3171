"""Following a SLURM job: a thread asks squeue about it and posts what it sees to the cluster's
inbox; the view shows it in place while the job is pending (a widget in Jupyter, a line on a
terminal), read from the thread that waits in ``ppkit.start``."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

from ppkit.cluster.inbox import Item
from ppkit.cluster.slurm import commands
from ppkit.errors import LaunchError

SOURCE = "slurm"  # the source of a job's items in the inbox
PENDING_POLL_S = 1.0
RUNNING_POLL_S = 3.0


@dataclass(frozen=True)
class JobUpdate:
    """What squeue said about ``job_id`` (``status`` None: SLURM no longer knows it), ``waited``
    seconds after it was submitted."""
    job_id: str
    status: commands.JobStatus | None
    waited: float


class JobWatch:
    def __init__(self, job_id: str, inbox, submitted: float):
        self.job_id, self._inbox, self._submitted = job_id, inbox, submitted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"ppkit-slurm-{job_id}")
        self._thread.start()

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                status = commands.status(self.job_id)
            except (LaunchError, OSError):
                status = last  # squeue did not answer this time; ask again
            pending = status is not None and status.state == "PENDING"
            if pending or status != last:
                self._inbox.put(Item(SOURCE, JobUpdate(self.job_id, status, time.monotonic() - self._submitted)))
            last = status
            if status is None or status.ended:
                return
            self._stop.wait(PENDING_POLL_S if pending else RUNNING_POLL_S)

    def stop(self) -> None:
        self._stop.set()


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def describe(update: JobUpdate) -> str:
    status = update.status
    if status is None:
        return f"SLURM job {update.job_id}: no longer known to SLURM"
    if status.state == "PENDING":
        reason = f" ({status.reason})" if status.reason not in ("", "None") else ""
        return f"SLURM job {update.job_id}: PENDING{reason}, waited {update.waited:.0f} s (squeue -j {update.job_id})"
    where = f" on {status.nodes}" if status.nodes else ""
    return f"SLURM job {update.job_id}: {status.state}{where}, {update.waited:.1f} s after it was submitted"


class PendingView:
    """One line about a job, updated in place."""

    def __init__(self, job_id: str, first: str):
        self._widget = None
        self._last = ""
        if _in_jupyter():
            try:
                import ipywidgets
                from IPython.display import display

                self._widget = ipywidgets.HTML(value=f"<code>{first}</code>")
                display(self._widget)
            except ImportError:
                pass
        self.show(first)

    def show(self, text: str) -> None:
        if text == self._last:
            return
        if self._widget is not None:
            self._widget.value = f"<code>{text}</code>"
        elif sys.stdout.isatty():
            print(f"\r{text:<100}", end="", flush=True)
        elif text.split(",")[0] != self._last.split(",")[0]:  # a log: a line per state, not per second
            print(text, flush=True)
        self._last = text

    def close(self) -> None:
        if self._widget is None and sys.stdout.isatty() and self._last:
            print(flush=True)
