"""Finding ppkit processes a test left behind (a plain module: test files import it by name).

It is not in conftest.py because tests/ and tests/browser/ each have a conftest, and
``from conftest import ...`` then picks whichever pytest imported first.
"""

from __future__ import annotations

import os
import time

import psutil

from ppkit.cluster.launchers import spare
from ppkit.cluster.launchers.base import LAUNCHED_BY_ENV

SLURM_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd", "slurmscriptd")
LEFTOVER_WAIT_S = 5.0  # how long the leftover checks wait for a process to end: a leak never ends, a slow exit does


def runs_ppkit(argv: list[str]) -> bool:
    """Whether a command line runs one of ppkit's programs: ``python [options] -m ppkit[.module] ...`` or the
    ``ppkit`` console script. Workers a fork server or agent forked keep their parent's command line."""
    if any(a == "-m" and (b == "ppkit" or b.startswith("ppkit.")) for a, b in zip(argv, argv[1:])):
        return True
    return len(argv) > 1 and os.path.basename(argv[0]).startswith("python") and os.path.basename(argv[1]) == "ppkit"


def is_ppkit_process(argv: list[str], environ: dict[str, str]) -> bool:
    """A process one of ppkit's launchers started (its environment carries their mark) or one of ppkit's
    programs (``ppkit worker`` started by hand or over ssh). Not any process whose command line happens to
    contain "ppkit": in a clone at ``.../ppkit/`` every program of the venv has that in its path."""
    if argv and os.path.basename(argv[0]).startswith(SLURM_DAEMONS):
        return False  # the SLURM test cluster's daemons, which pass the environment on to the jobs
    return LAUNCHED_BY_ENV in environ or runs_ppkit(argv)


def ppkit_children() -> list[psutil.Process]:
    """Processes started by this test run that are ppkit's own: workers, fork servers, agents, ``ppkit`` CLIs.
    Not this process's spare fork server (ppkit/cluster/launchers/spare.py), which waits for the next cluster
    and leaves by itself; those of other processes (kernels, CLIs) end with them."""
    me = os.getpid()
    waiting = spare.pid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            argv = proc.info["cmdline"] or []
            env = proc.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.pid not in (me, waiting) and env.get("PPKIT_TEST_OWNER") == str(me) and is_ppkit_process(argv, env):
            found.append(proc)
    return found


def end_leftovers(pids, timeout: float = 5.0) -> list[str]:
    """Wait up to ``timeout`` for ``pids`` to end; kill what is still there and describe it (pid and command).

    A check that finds a leftover fails its own test and then kills it, so one leak fails one test, not
    every later test that looks."""
    described = []
    for pid in wait_gone(pids, timeout):
        try:
            proc = psutil.Process(pid)
            described.append(f"{pid} ({' '.join(proc.cmdline())[:120]}; {_whose(proc)})")
            proc.kill()
        except psutil.Error:
            continue
    return described


def _whose(proc: psutil.Process) -> str:
    """Where a leftover came from: its age, state, threads, and its parent (a fork server's workers keep its
    command line, so the parent tells a worker from a fork server)."""
    try:
        said = (f"{proc.status()}, {time.time() - proc.create_time():.0f} s old, {proc.num_threads()} threads, "
                f"parent {proc.ppid()}")
    except psutil.Error as exc:
        return f"no more known: {exc}"
    if proc.ppid() == os.getpid():
        return said + " (this test process)"
    try:
        return said + f" ({' '.join(psutil.Process(proc.ppid()).cmdline())[:80]})"
    except psutil.Error:
        return said + " (gone, or a zombie)"


def wait_gone(pids, timeout: float = 5.0, *, spare_too: bool = False) -> list[int]:
    """The pids still running (zombies count as gone) after waiting up to ``timeout`` for them to end.

    A closed cluster's fork server, parked as this process's spare for the next cluster
    (ppkit/cluster/launchers/spare.py), counts as gone unless ``spare_too``: closing did end its part."""
    deadline = time.monotonic() + timeout
    waiting = None if spare_too else spare.pid()
    alive = [p for p in pids if p != waiting and _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pid_of(cluster, role: str) -> int:
    """The pid of the cluster's one process in ``role`` ("fork server", "slurm job"), from Cluster.processes()."""
    found = [p.pid for p in cluster.processes() if p.role == role]
    assert len(found) == 1 and found[0] is not None, f"one {role} expected among {cluster.processes()}"
    return found[0]


def slurm_job_id(cluster) -> str:
    """The id of the SLURM job that runs the cluster's ranks (Cluster.processes() names it "job <id>")."""
    where = [p.where for p in cluster.processes() if p.role == "slurm job"]
    assert len(where) == 1 and where[0].startswith("job "), f"one SLURM job expected among {cluster.processes()}"
    return where[0].removeprefix("job ")
