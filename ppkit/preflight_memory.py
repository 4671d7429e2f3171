"""``ppkit preflight``'s memory check: which notebooks fit in this learner's memory limit and /dev/shm.

Each notebook's need is measured (ppkit/notebook_memory.py, the table of docs/memory.md); the limit is what
ppkit/cluster/memory.py reads (the cgroup's, MEM_LIMIT, else the machine's memory). A notebook that does not
fit would have a worker, or the kernel, killed by the kernel's out-of-memory killer part-way through; this
says so before the learner starts, and what to ask the instructor for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppkit.cluster.memory import MemoryLimit, ShmSize, gib, read_memory_limit, read_shm
from ppkit.notebook_memory import MEASURED, MIB, NotebookMemory

SHM_HOW = ("docker run --shm-size=1g; Kubernetes: an emptyDir with medium Memory mounted at /dev/shm "
           "(docs/workshop.md)")


@dataclass(frozen=True)
class MemoryVerdict:
    status: str  # ok, warn or FAIL, as preflight's Check
    detail: str
    fix: str = ""
    too_big: tuple[str, ...] = ()  # the notebooks that will not fit


def _short(notebooks) -> str:
    return ", ".join(n.notebook.split("_")[0] for n in notebooks)


def memory_verdict(limit: MemoryLimit | None = None, shm: ShmSize | None = None,
                   measured: tuple[NotebookMemory, ...] = MEASURED) -> MemoryVerdict:
    limit = read_memory_limit() if limit is None else limit
    shm = read_shm() if shm is None else shm
    notes = list(limit.notes) + list(shm.notes)
    detail = f"memory limit {limit}; /dev/shm {gib(shm.total)}"
    over_memory = [n for n in measured if limit.bytes is not None and n.need_mib * MIB > limit.bytes]
    over_shm = [n for n in measured if shm.total is not None and n.shm_need_mib * MIB > shm.total]
    too_big = sorted({n.notebook for n in over_memory + over_shm})
    detail += "".join(f"; {note}" for note in notes)
    if not measured:
        return MemoryVerdict("warn", detail + ": no notebook's need is measured in this ppkit",
                             "in a clone of the project's repository, run benchmarks/bench_memory.py (docs/memory.md)")
    if not too_big:
        largest = max(measured, key=lambda n: n.need_mib)
        return MemoryVerdict("warn" if notes else "ok", detail + f": every notebook fits (the largest, "
                             f"{largest.notebook}, needs {gib(largest.need_mib * MIB)})")
    asks = []
    if over_memory:
        largest = max(over_memory, key=lambda n: n.need_mib)
        asks.append(f"a memory limit of at least {gib(largest.need_mib * MIB)} (for {largest.notebook})")
    if over_shm:
        largest = max(over_shm, key=lambda n: n.shm_need_mib)
        asks.append(f"a /dev/shm of at least {gib(largest.shm_need_mib * MIB)} ({SHM_HOW})")
    why = (f" need more memory than the limit: {_short(over_memory)}" if over_memory else "") + (
        f"{';' if over_memory else ''} need more /dev/shm: {_short(over_shm)}" if over_shm else "")
    status = "FAIL" if len(too_big) == len(measured) else "warn"
    return MemoryVerdict(status, f"{detail}: notebook(s){why} (a worker, or the kernel itself, would be killed "
                         "part-way, out of memory; docs/memory.md)", "ask the instructor for " + " and ".join(asks),
                         tuple(too_big))
