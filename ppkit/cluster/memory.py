"""How much memory this kernel and its workers may use, and how big /dev/shm is.

On a laptop the limit is the machine's memory. On a shared server a JupyterHub spawner gives each learner
a share: a cgroup limit that the kernel enforces (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, set by
systemd for The Littlest JupyterHub or by Kubernetes for Zero to JupyterHub) and MEM_LIMIT in the
environment (in bytes). Past the cgroup's limit the kernel's out-of-memory killer ends a process with
SIGKILL and counts it in the cgroup (v2 ``memory.events`` ``oom_kill``, v1 ``memory.oom_control``), which
is how a worker's death is told apart from other kills (ppkit/cluster/oom.py).

/dev/shm is a separate, smaller limit in a container (64 MB by default in Docker). Like budget.py, an
unreadable or odd value is a note that says what was read and what was used, never an error.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ppkit.cluster.budget import CGROUP_ROOT

UNLIMITED = 2**60  # v1 writes "no limit" as 9223372036854771712; anything this large is none
SHM = Path("/dev/shm")
PROC_CGROUP = Path("/proc/self/cgroup")  # which cgroup this process is in (one line per hierarchy)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


@dataclass(frozen=True)
class MemoryLimit:
    """``bytes`` this kernel and its workers may use together (None: unknown) and where that came from;
    ``cgroup``: the folder of this process's memory cgroup (where its oom_kill count is), if any."""
    bytes: int | None
    source: str
    notes: tuple[str, ...] = ()
    limited: bool = False  # True: a cgroup or MEM_LIMIT, not just the machine's memory
    cgroup: Path | None = None
    version: int | None = None  # that cgroup's version, 1 or 2

    def __str__(self) -> str:
        return f"{gib(self.bytes)} ({self.source})" if self.bytes is not None else f"unknown ({self.source})"


@dataclass(frozen=True)
class ShmSize:
    """/dev/shm's size and free space in bytes (None where it could not be read)."""
    total: int | None
    free: int | None
    notes: tuple[str, ...] = ()


def gib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def parse_bytes(text: str, what: str, notes: list[str]) -> int | None:
    """A byte count: "4294967296", "4G", "512M" (as JupyterHub writes them); None (and a note) otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    value = float(match.group(1)) * _UNITS[match.group(2).upper()] if match else math.nan
    if not 0 < value < math.inf:
        notes.append(f"{what}={text!r} is not a positive number of bytes; ignored")
        return None
    return int(value)


def _own_cgroup(root: Path, proc: Path) -> tuple[Path, int] | None:
    """This process's memory cgroup folder: v1's under ``root``/memory, else v2's; with its version."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(",") and (root / "memory").is_dir():
            own = root / "memory" / path.lstrip("/")  # in a container the mount's root is the container's
            return (own if own.is_dir() else root / "memory"), 1
        if number == "0" and controllers == "" and (root / "cgroup.controllers").exists():
            own = root / path.lstrip("/")
            return (own if own.is_dir() else root), 2
    return None


def cgroup_limit(root: Path = CGROUP_ROOT, notes: list[str] | None = None,
                 proc: Path = PROC_CGROUP) -> tuple[int | None, str, Path | None, int | None]:
    """(the smallest limit on this cgroup and the ones above it, in bytes, or None; where; own folder; version)."""
    notes = [] if notes is None else notes
    own = _own_cgroup(root, proc)
    if own is None:
        return None, "", None, None
    folder, version = own
    name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    top = root if version == 2 else root / "memory"
    best: tuple[int, str] | None = None
    while True:
        file = folder / name
        try:
            text = file.read_text().strip()
        except FileNotFoundError:
            text = "max"  # v2's root has no memory.max: no limit there
        except OSError as exc:
            notes.append(f"cannot read {file} ({exc.strerror or exc}); ignored")
            text = "max"
        if text != "max":
            value = parse_bytes(text, str(file), notes)
            if value is not None and value < UNLIMITED and (best is None or value < best[0]):
                best = (value, f"cgroup {file}")
        if folder == top or top not in folder.parents:
            break
        folder = folder.parent
    return (*(best or (None, "")), own[0], version)


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not on this platform
        return None


def read_memory_limit(environ=None, root: Path = CGROUP_ROOT, physical: int | None = None,
                      proc: Path = PROC_CGROUP) -> MemoryLimit:
    """The smallest of the cgroup's limit, MEM_LIMIT (a JupyterHub spawner's) and the machine's memory."""
    environ = os.environ if environ is None else environ
    notes: list[str] = []
    physical = machine_memory() if physical is None else physical
    found = [(physical, "the machine's memory")] if physical else []
    limit, where, cgroup, version = cgroup_limit(root, notes, proc)
    if limit is not None:
        found.append((limit, where))
    if environ.get("MEM_LIMIT"):
        value = parse_bytes(environ["MEM_LIMIT"], "MEM_LIMIT", notes)
        if value is not None:
            found.append((value, f"MEM_LIMIT={environ['MEM_LIMIT']} from the JupyterHub spawner"))
    if not found:
        return MemoryLimit(None, "no limit found, the machine's memory unknown", tuple(notes), False, cgroup, version)
    value, source = min(found)
    return MemoryLimit(value, source, tuple(notes), source != "the machine's memory", cgroup, version)


def read_shm(path: Path = SHM) -> ShmSize:
    try:
        stats = os.statvfs(path)
    except OSError as exc:
        return ShmSize(None, None, (f"cannot read {path}'s size ({exc.strerror or exc})",))
    return ShmSize(stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize)
