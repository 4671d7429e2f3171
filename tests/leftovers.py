"""Finding ppkit processes a test left behind (a plain module: test files import it by name).

It is not in conftest.py because tests/ and tests/browser/ each have a conftest, and
``from conftest import ...`` then picks whichever pytest imported first.
"""

from __future__ import annotations

import os
import time

import psutil

SLURM_DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd", "slurmscriptd")


def ppkit_children() -> list[psutil.Process]:
    """Processes started by this test run that are ppkit workers or fork servers."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cmd.split(" ")[0].rsplit("/", 1)[-1].startswith(SLURM_DAEMONS):
            continue  # the SLURM test cluster's daemons (their files are in a ppkit-slurm-* folder)
        if proc.pid != me and "ppkit" in cmd and env.get("PPKIT_TEST_OWNER") == str(me):
            found.append(proc)
    return found


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        time.sleep(0.05)
    return alive


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
