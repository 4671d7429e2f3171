"""Stage resources: each stage process gets its own CPU cores and thread count.

Two stages that share all cores slow each other down as soon as they overlap, and pipelining then
pays off far less than the bubble model says. With ``stage_threads="auto"`` the cores of each host
are split between the stage processes on that host (in stage order), each stage process is pinned
to its cores (Linux ``sched_setaffinity``, every thread of the process) and runs torch with one
thread per core. The master, when it holds no shard, only computes the loss: it gets one thread and
the cores the stages left over (none left: its affinity is kept, it mostly sleeps in RPC waits).
A stage on a GPU keeps its device as its resource: its process is left as it is.

    plans = assign(placement, "auto")     # after the stages exist; world.close() undoes the master's
    print(describe(plans))

Every process remembers its own settings from before the first change and goes back to them with
:func:`restore` (workers die on ``world.restart()``/``close()``; the master is restored then).
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass

from ppkit.errors import ConfigError

AUTO = "auto"
OFF = "off"

_original: dict | None = None  # this process's settings before ppkit changed them
_lock = threading.Lock()
# torch's thread count is per thread underneath (OpenMP keeps one per thread, and torch reads the
# global setting only once per thread): each thread that computes calls sync_threads() first.
_wanted_threads: int | None = None
_generation = 0
_seen = threading.local()


def check_stage_threads(value) -> str | int:
    """``"auto"``, ``"off"`` or a whole number of threads per stage process (ConfigError otherwise)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in (AUTO, OFF):
            return text
        if text.isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"stage threads {value!r}: use 'auto' (split this machine's cores between the stages), "
            "'off' (leave every process as it is) or a whole number of threads per stage process.")
    return value


# -- in every process (called over RPC) -----------------------------------------------------------

def _affinity() -> tuple[int, ...] | None:
    if not hasattr(os, "sched_getaffinity"):
        return None
    return tuple(sorted(os.sched_getaffinity(0)))


def _set_affinity(cpus) -> None:
    # sched_setaffinity(0) pins the calling thread only: pin every thread of the process (stage
    # compute thread, RPC threads, OpenMP workers); threads started later inherit from their creator.
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):  # a thread that ended meanwhile
            pass


def sync_threads() -> None:
    """Give the calling thread this process's current torch thread count (cheap when unchanged)."""
    if getattr(_seen, "generation", 0) != _generation:
        _seen.generation = _generation
        if _wanted_threads is not None:
            import torch

            torch.set_num_threads(_wanted_threads)


def _want(threads: int | None) -> None:
    global _wanted_threads, _generation
    _wanted_threads = threads
    _generation += 1
    sync_threads()


def want_threads(threads: int) -> int:
    """Give every computing thread of this process ``threads`` torch threads from its next
    :func:`sync_threads` on; return the count they had (setting it on one RPC thread would not do)."""
    import torch

    with _lock:
        previous = _wanted_threads if _wanted_threads is not None else torch.get_num_threads()
        _want(threads)
    return previous


def current() -> dict:
    """This process's pid, torch threads (as its computing threads get them) and affinity."""
    import torch

    sync_threads()
    return {"pid": os.getpid(), "threads": torch.get_num_threads(), "cpus": _affinity()}


def host_report() -> dict:
    """This process's host, pid, cores it may use (before ppkit's change) and torch threads."""
    import torch

    with _lock:
        original = _original
    from ppkit.cluster.budget import read_budget

    return {"host": socket.gethostname(), "pid": os.getpid(), "budget": read_budget().cores,
            "cpus": original["cpus"] if original else _affinity(),
            "threads": original["threads"] if original else torch.get_num_threads()}


def apply(threads: int | None, cpus) -> dict:
    """Set this process's torch threads and (Linux) affinity; remember the originals once."""
    import torch

    global _original
    with _lock:
        if _original is None:
            _original = {"cpus": _affinity(), "threads": torch.get_num_threads()}
        if cpus is not None and hasattr(os, "sched_setaffinity"):
            _set_affinity(cpus)
        _want(threads if threads is not None else _original["threads"])
    return {"pid": os.getpid(), "threads": torch.get_num_threads(), "cpus": _affinity()}


def restore() -> bool:
    """Undo :func:`apply` in this process; False if there was nothing to undo."""

    global _original
    with _lock:
        if _original is None:
            return False
        if _original["cpus"] is not None:
            _set_affinity(_original["cpus"])
        _want(_original["threads"])
        _original = None
    return True


# -- on the master: plan and apply ----------------------------------------------------------------

@dataclass(frozen=True)
class ProcessPlan:
    """What one process gets: ``stages`` (0-based) it holds, threads and cores (None: unchanged)."""

    process: str
    stages: tuple[int, ...]
    devices: tuple[str, ...]
    threads: int | None
    cpus: tuple[int, ...] | None
    note: str = ""

    def describe(self) -> str:
        who = (f"stage {'+'.join(str(s + 1) for s in self.stages)} on {self.process}"
               if self.stages else self.process)
        if self.threads is None and self.cpus is None:
            what = self.note or "unchanged"
        else:
            what = []
            if self.threads is not None:
                what.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
            if self.cpus is not None:
                what.append(f"core{'s' if len(self.cpus) != 1 else ''} {_cpu_list(self.cpus)}")
            what = ", ".join(what) + (f" ({self.note})" if self.note else "")
        return f"{who}: {what}"


def _cpu_list(cpus) -> str:
    """(0, 1, 2, 5) -> '0-2,5'."""
    parts, run = [], []
    for cpu in sorted(cpus):
        if run and cpu != run[-1] + 1:
            parts.append(run)
            run = []
        run.append(cpu)
    if run:
        parts.append(run)
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in parts)


def _split(cpus: list[int], count: int) -> list[list[int]]:
    """``cpus`` in ``count`` contiguous shares as equal as can be (the first ones get the extra)."""
    base, extra = divmod(len(cpus), count)
    shares, start = [], 0
    for i in range(count):
        size = base + (1 if i < extra else 0)
        shares.append(cpus[start:start + size])
        start += size
    return shares


def plan(placement, setting, reports: dict[str, dict], master: str = "master") -> list[ProcessPlan]:
    """One :class:`ProcessPlan` per process of ``placement`` (and the master), from ``reports``:
    :func:`host_report` of every one of those processes."""
    setting = check_stage_threads(setting)
    holders: dict[str, list[int]] = {}
    for index, p in enumerate(placement):
        holders.setdefault(p.process, []).append(index)
    devices = {name: tuple(placement[i].device for i in stages) for name, stages in holders.items()}
    on_cpu = [name for name in holders if all(d == "cpu" for d in devices[name])]
    plans: dict[str, ProcessPlan] = {}
    if setting == OFF:
        for name in holders:
            plans[name] = ProcessPlan(name, tuple(holders[name]), devices[name], None, None,
                                      "unchanged (--stage-threads off)")
        return list(plans.values())
    by_host: dict[str, list[str]] = {}
    for name in on_cpu:
        by_host.setdefault(reports[name]["host"], []).append(name)
    left_over: dict[str, list[int]] = {}
    for host, names in by_host.items():
        cpus = list(reports[names[0]]["cpus"] or [])
        budget = reports[names[0]].get("budget")
        if budget is not None:  # a share of a shared server: no more cores than the learner's CPU budget
            cpus = cpus[:max(1, int(budget))]
        if setting == AUTO and len(cpus) >= len(names):
            shares = _split(cpus, len(names))
            for name, share in zip(names, shares, strict=True):
                plans[name] = ProcessPlan(name, tuple(holders[name]), devices[name], len(share), tuple(share))
            left_over[host] = []
        elif setting == AUTO:  # fewer cores than stage processes: threads only, no pinning
            for name in names:
                plans[name] = ProcessPlan(name, tuple(holders[name]), devices[name], 1, None,
                                          f"{len(cpus)} cores for {len(names)} stage processes")
            left_over[host] = []
        else:
            for name in names:
                plans[name] = ProcessPlan(name, tuple(holders[name]), devices[name], setting, None)
            left_over[host] = cpus
    for name in holders:
        if name not in plans:
            plans[name] = ProcessPlan(name, tuple(holders[name]), devices[name], None, None,
                                      "its device is its resource")
    if master not in holders and master in reports:
        host = reports[master]["host"]
        free = left_over.get(host, list(reports[master]["cpus"] or []))
        if setting == AUTO and host in by_host and free:
            plans[master] = ProcessPlan(master, (), (), 1, tuple(free), "no shard: the loss only")
        elif setting == AUTO and host in by_host:
            plans[master] = ProcessPlan(master, (), (), 1, None,
                                        "no shard: the loss only; no core left over, so not pinned")
        else:
            plans[master] = ProcessPlan(master, (), (), 1, None, "no shard: the loss only")
    return list(plans.values())


def describe(plans: list[ProcessPlan]) -> str:
    return "; ".join(p.describe() for p in plans)


def assign(placement, setting, *, timeout: float = 30) -> list[ProcessPlan]:
    """Plan and apply stage resources over the running RPC world; returns the plans.

    Every process starts again from its own settings from before ppkit's first change, so a new
    placement re-splits the cores. The master goes back to its own when the world closes.
    """
    import torch.distributed.rpc as rpc

    setting = check_stage_threads(setting)
    me = rpc.get_worker_info().name
    names = list(dict.fromkeys([*(p.process for p in placement), me]))
    futures = {name: rpc.rpc_async(name, host_report, timeout=timeout) for name in names}
    reports = {name: future.wait() for name, future in futures.items()}
    plans = plan(placement, setting, reports, master=me)
    # The master applies its own here, in this thread (the one that computes the loss).
    changes = [rpc.rpc_async(p.process, apply, args=(p.threads, p.cpus), timeout=timeout)
               for p in plans if p.process != me]
    for p in plans:
        if p.process == me:
            apply(p.threads, p.cpus)
            _register_restore()
    for future in changes:
        future.wait()
    return plans


def _register_restore() -> None:
    """Have the active RPC world restore this process's settings when it restarts or closes."""
    from ppkit.cluster.rpc import world as rpc_world

    world = rpc_world.active()
    if world is not None:
        world.add_cleanup(restore)
