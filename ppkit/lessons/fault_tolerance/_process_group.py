"""Children of the lesson: their environment, and stopping one (started with ``start_new_session=True``)
together with everything it started."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from ppkit.cluster.launchers.base import LAUNCHED_BY_ENV


def stop_group(process: subprocess.Popen, grace: float = 2.0, sig: int = signal.SIGTERM) -> None:
    """``sig`` (SIGTERM) to the child's process group, ``grace`` seconds, SIGKILL, reap it; then SIGKILL the
    group once more for anything it left behind and wait until the group is empty. Idempotent."""
    for signum, wait in ((sig, grace), (signal.SIGKILL, 5.0)):
        if process.poll() is None:
            _signal_group(process.pid, signum)
        try:
            process.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # the leader is reaped; Linux does not give its pid to a new process while its group still has members
    _signal_group(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and _signal_group(process.pid, 0):
        time.sleep(0.02)


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def child_env() -> dict[str, str]:
    """This environment, marked as ppkit's (the mark the suite's leftover checks look for)."""
    return {**os.environ, LAUNCHED_BY_ENV: str(os.getpid())}
