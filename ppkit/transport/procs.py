"""Process helpers: die with the parent (PR_SET_PDEATHSIG, or a parent watch alone), go first when memory
runs out, stop politely then firmly, bound a call that may hang."""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
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
    watch_parent(expected_ppid if expected_ppid is not None else os.getppid())


def watch_parent(ppid: int, interval: float = 0.5) -> None:
    """Exit (code 1) once process ``ppid`` is gone: now, or later from a daemon thread.

    POSIX reparents an orphan (``getppid()`` changes); on Windows ``getppid()`` keeps the old
    number, so there the thread asks whether that process still runs.
    """
    if not _parent_alive(ppid):
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(ppid, interval), name="ppkit-parent-watch",
                     daemon=True).start()


def _parent_alive(ppid: int) -> bool:
    if os.getppid() != ppid:
        return False
    if sys.platform == "win32":
        return _windows_pid_alive(ppid)
    return True


def _windows_pid_alive(pid: int) -> bool:
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
    if not handle:
        return False
    try:
        code = ctypes.c_ulong()
        return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == 259  # STILL_ACTIVE
    finally:
        kernel32.CloseHandle(handle)


def _watch_parent(ppid: int, interval: float) -> None:
    while True:
        time.sleep(interval)
        if not _parent_alive(ppid):
            os._exit(1)


WORKER_OOM_SCORE_ADJ = 500  # of -1000..1000; 0 is every process's default


def volunteer_for_oom_kill(adj: int = WORKER_OOM_SCORE_ADJ) -> int | None:
    """Raise this process's ``oom_score_adj`` to ``adj`` (never lower it) and return the value now set.

    When a learner's memory limit is reached, the kernel's OOM killer ends the process with the highest
    score, and a worker that just took 2 GB does not always outscore the notebook kernel or the fork
    server (which reports every worker's exit status: measured in CI, the killer took rank 1, then the
    fork server). A worker's raised score makes the workers go first. Raising needs no privilege;
    None where there is no /proc (not Linux) or it refuses."""
    try:
        with open("/proc/self/oom_score_adj", "r+") as f:
            current = int(f.read().strip() or 0)
            if current < adj:
                f.seek(0)
                f.write(str(adj))
                f.flush()
                current = adj
        return current
    except (OSError, ValueError):
        return None


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


def exited(process) -> bool:
    """Whether a ``subprocess.Popen`` has exited. Not ``poll() is not None`` alone: poll() answers None, without
    looking, when it cannot take the Popen's wait lock (another thread is inside ``wait()`` on it), even for a
    process that is long dead."""
    return process.poll() is not None or not pid_alive(process.pid)


def stop_processes(processes: list, grace: float = 2.0) -> None:
    """Stop ``subprocess.Popen`` objects politely, then firmly: terminate each one still running,
    give them ``grace`` seconds, kill what is left, and reap them all. Through Popen, which never
    signals a pid it has already reaped (another process may have that pid by now)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


_lasting: dict = {}  # pid -> the queue of this process's lasting thread (a fork starts its own)
_lasting_lock = threading.Lock()


def in_lasting_thread(fn):
    """``fn()``, run by a thread that lives as long as this process; its result or its exception.

    PR_SET_PDEATHSIG fires when the *thread* that forked a process ends, not the process: a fork
    server started from a short-lived thread (a notebook's background thread, a test's helper)
    would be killed, with its workers, as soon as that thread returned. So a process that must
    die with this one is started from the main thread (it lives as long as the process) and,
    from any other thread, by one daemon thread kept for that. Ctrl-C reaches the main thread
    only, so only there could a hand-over be interrupted half-way, leaving a process untracked.
    """
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _lasting_lock:
        jobs = _lasting.get(os.getpid())
        if jobs is None:
            jobs = _lasting[os.getpid()] = queue.SimpleQueue()
            threading.Thread(target=_serve_lasting, args=(jobs,), name="ppkit-starter", daemon=True).start()
    done, box = threading.Event(), []
    jobs.put((fn, box, done))
    done.wait()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _serve_lasting(jobs) -> None:
    while True:
        fn, box, done = jobs.get()
        try:
            box.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.append((False, exc))
        done.set()


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
