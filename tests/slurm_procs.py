"""Finding and stopping the processes of one SLURM test cluster (tests/slurm_testbed.py).

The daemons are the testbed's own children, each in its own process group. What they start is
not: slurmstepd double-forks into a session of its own, and a job's tasks are its children, so
they are found by environment. Every daemon gets ``PPKIT_SLURM_TESTBED=<its directory>`` (and
slurmd ``PPKIT_SLURM_NODE=<node>``), which slurmstepd inherits; a task carries the SLURM_CONF
and SLURM_JOB_ID its job was given.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time

import psutil

MARK = "PPKIT_SLURM_TESTBED"  # in every daemon's environment: the testbed's directory
NODE_MARK = "PPKIT_SLURM_NODE"  # in slurmd's: which node it serves


def die_with_parent() -> None:
    """preexec_fn: SIGTERM this child when the thread that started it ends (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)


def stop_groups(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM each daemon's process group, wait up to ``grace`` s, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)  # the daemon and what it forked into its group (slurmscriptd)
        deadline = time.monotonic() + wait
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            time.sleep(0.05)
    for p in procs:  # a daemon that died by itself may have left its group behind
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)


def cluster_processes(tmpdir: str, conf_path: str, daemons: set[int], node: str | None = None) -> list[psutil.Process]:
    """The cluster's slurmstepd and their descendants, and its jobs' tasks (on ``node`` only, if given).

    ``daemons``: the pids of the daemons, each the leader of its process group, which is left out.
    """
    found = set()
    skip = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(OSError):
            if proc.pid in skip or os.getpgid(proc.pid) in daemons:  # a daemon's group (slurmscriptd): stop_groups
                continue
        env = environ(proc.pid)
        stepd = env.get(MARK) == tmpdir
        task = env.get("SLURM_CONF") == conf_path and "SLURM_JOB_ID" in env
        on_node = node is None or env.get(NODE_MARK) == node or env.get("SLURMD_NODENAME") == node
        if (stepd or task) and on_node:
            found.add(proc)
            with contextlib.suppress(psutil.Error):
                found.update(proc.children(recursive=True))
    return sorted(found, key=lambda p: p.pid)


def kill_all(procs: list[psutil.Process], timeout: float = 5.0) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=timeout)


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def environ(pid: int) -> dict[str, str]:
    """A process's environment as it was exec'd, read past the NULs that a process title leaves.

    slurmstepd writes its title ("slurmstepd: [12.0]") over argv and the start of its environment,
    zeroing it; psutil's environ() stops at the first empty entry, so it sees nothing. The markers
    come last in the daemons' environment, where the title does not reach.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return env
