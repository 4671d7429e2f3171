"""Process helpers: die with the parent, stop politely then firmly, bound a call that may hang."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent(expected_ppid: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies, and watch the parent too.

    PR_SET_PDEATHSIG is the fast path; the watch thread covers the race where the parent died
    before prctl ran, and platforms without prctl.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:
            pass
    ppid = expected_ppid if expected_ppid is not None else os.getppid()
    if os.getppid() != ppid:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(ppid,), name="ppkit-parent-watch", daemon=True).start()


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != ppid:
            os._exit(1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0); it is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def stop_pids(pids: list[int], grace: float = 2.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left."""
    live = [p for p in pids if pid_alive(p)]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        for pid in live:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while live and time.monotonic() < deadline:
            live = [p for p in live if pid_alive(p)]
            if live:
                time.sleep(0.02)
        if not live:
            return


def run_with_deadline(fn, seconds: float) -> tuple[bool, BaseException | None]:
    """Run ``fn`` in a daemon thread; (finished?, exception). A hung call is left behind."""
    outcome: list = []

    def target():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True, name="ppkit-rpc")
    thread.start()
    thread.join(seconds)
    return (bool(outcome), outcome[0] if outcome else None)


@contextlib.contextmanager
def muted_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
