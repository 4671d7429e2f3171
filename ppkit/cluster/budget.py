"""How many cores this kernel and its workers may use: the learner's CPU budget.

On a laptop that is every core. On a shared server it is much less: a JupyterHub spawner gives
each learner a share (CPU_LIMIT / CPU_GUARANTEE in the environment, and a cgroup quota that the
kernel enforces), and the process may be pinned to a few cores (affinity). ``os.cpu_count()``
sees none of that: 30 learners x 4 workers x every core's worth of torch threads oversubscribe
the machine many times over. ppkit reads all of them, takes the smallest, and gives each local
worker ``budget / workers`` torch threads (at least one) where something limits the learner, unless
the learner sets them (``OMP_NUM_THREADS`` in ``env=``, or $PPKIT_CPU_BUDGET to change the budget).

An unreadable or odd value is a note that says what was read and what was used, never an error.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

BUDGET_ENV = "PPKIT_CPU_BUDGET"  # the learner's own override, in cores (e.g. 2 or 0.5)
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuBudget:
    """``cores`` this kernel may use (may be fractional: a cgroup quota of 1.5 CPUs) and where that
    came from; ``notes`` say what was read but could not be used."""
    cores: float
    source: str
    notes: tuple[str, ...] = ()
    limited: bool = True  # False: nothing but the cores this process may run on (a laptop, a whole VM)

    def threads_per_worker(self, workers: int, env=None) -> int | None:
        """Each of ``workers``' torch threads, or None to leave torch's default. The learner's
        OMP_NUM_THREADS (in ``env``, else this process's) wins: a forked worker's torch has read its
        environment already, so it is applied. Where nothing limits the learner, torch's default
        stays: the kernel's own torch uses it too, and a worker on another thread count can round
        differently (convolutions take another path), so results compared with the kernel's differ."""
        own = (env or {}).get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS", "")
        if own.strip().isdigit() and int(own) > 0:
            return int(own)
        if not self.limited:
            return None
        return max(1, math.floor(self.cores / max(1, workers)))

    def __str__(self) -> str:
        return f"{self.cores:g} core(s) ({self.source})"


def _number(text: str, what: str, notes: list[str]) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        notes.append(f"{what}={text!r} is not a number of cores; ignored")
        return None
    if not 0 < value < math.inf:
        notes.append(f"{what}={text!r} is not a positive number of cores; ignored")
        return None
    return value


def _cgroup_v2_dir(root: Path) -> Path:
    """This process's own cgroup v2 folder (``0::/path`` in /proc/self/cgroup), else the root."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                own = root / line[3:].lstrip("/")
                if (own / "cpu.max").exists():
                    return own
    except OSError:
        pass
    return root


def cgroup_quota(root: Path = CGROUP_ROOT, notes: list[str] | None = None) -> tuple[float, str] | None:
    """The cgroup's CPU quota in cores (v2 cpu.max, else v1 cfs_quota_us / cfs_period_us), or None."""
    notes = [] if notes is None else notes
    v2 = _cgroup_v2_dir(root) / "cpu.max"
    try:
        quota, _, period = v2.read_text().strip().partition(" ")
    except OSError:
        quota = None
    if quota is not None:
        if quota == "max":
            return None
        q, p = _number(quota, str(v2), notes), _number(period or "100000", str(v2), notes)
        return (q / p, f"cgroup {v2}: {quota} {period}") if q and p else None
    for folder in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = root / folder
        try:
            quota_text = (base / "cpu.cfs_quota_us").read_text().strip()
            period_text = (base / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            continue
        if quota_text == "-1":
            return None
        q, p = _number(quota_text, str(base / "cpu.cfs_quota_us"), notes), _number(period_text, "cfs_period_us", notes)
        return (q / p, f"cgroup {base}: cfs_quota_us {quota_text} / cfs_period_us {period_text}") if q and p else None
    return None


def affinity_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def read_budget(environ=None, root: Path = CGROUP_ROOT, affinity: int | None = None) -> CpuBudget:
    """The smallest of: the learner's $PPKIT_CPU_BUDGET (which wins outright), CPU_GUARANTEE (a
    spawner's fair share) or else CPU_LIMIT, the cgroup quota, and the cores this process may run on."""
    environ = os.environ if environ is None else environ
    notes: list[str] = []
    cores = affinity if affinity is not None else affinity_cores()
    if environ.get(BUDGET_ENV):
        own = _number(environ[BUDGET_ENV], BUDGET_ENV, notes)
        if own is not None:
            return CpuBudget(own, f"{BUDGET_ENV}={environ[BUDGET_ENV]}, set by you", tuple(notes))
    found = [(float(cores), f"{cores} core(s) this process may run on")]
    quota = cgroup_quota(root, notes)
    if quota is not None:
        found.append(quota)
    for name in ("CPU_GUARANTEE", "CPU_LIMIT"):  # set by JupyterHub spawners; the guarantee is the fair share
        if environ.get(name):
            value = _number(environ[name], name, notes)
            if value is not None:
                found.append((value, f"{name}={environ[name]} from the JupyterHub spawner"))
                break
    budget, source = min(found)  # the fewest cores (then by name: any order is fine for equal ones)
    return CpuBudget(budget, source, tuple(notes), limited=budget < cores)
