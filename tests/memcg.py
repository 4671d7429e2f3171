"""A memory cgroup of its own, made under this process's cgroup for a test or a measurement, removed after.

    with MemoryCgroup("oom-test", limit_bytes=300 * 2**20) as group:
        subprocess.run(["sh", "-c", f"echo $$ > {group.procs}; exec python big.py"])
        group.oom_kills()     # how many processes the kernel's OOM killer killed in it
        group.peak()          # the most memory it was charged at once

cgroup v1 (a ``memory`` hierarchy, as on this machine) and v2 (the unified tree, where this process's
cgroup must be able to delegate the memory controller to a child). Needs root or a delegated cgroup;
:class:`CgroupUnavailable` says why it could not be made. ``close()`` kills what is left inside (it is the
caller's), waits for it to go and removes the folder.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made here (not root, no memory controller, not delegated)."""


def _own_path(controller_line: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if controller_line == "v2" and number == "0" or controller_line in controllers.split(","):
            return path.lstrip("/")
    raise CgroupUnavailable(f"/proc/self/cgroup names no {controller_line!r} cgroup")


def _parent_folder(root: Path) -> tuple[Path, int]:
    """The folder to make a child memory cgroup in, and the cgroup version."""
    v1 = root / "memory"
    if (v1 / "memory.limit_in_bytes").exists():
        own = v1 / _own_path("memory")
        return (own if own.is_dir() else v1), 1
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        own = root / _own_path("v2")
        own = own if own.is_dir() else root
        if "memory" not in (own / "cgroup.subtree_control").read_text().split():
            try:
                (own / "cgroup.subtree_control").write_text("+memory")
            except OSError as exc:  # a cgroup with processes in it cannot delegate (no internal processes)
                raise CgroupUnavailable(f"cannot enable the memory controller below {own}: {exc}") from exc
        return own, 2
    raise CgroupUnavailable(f"no memory controller under {root} (neither v1's memory/ nor v2's cgroup.controllers)")


class MemoryCgroup:
    def __init__(self, name: str, limit_bytes: int | None = None, root: Path = ROOT):
        parent, self.version = _parent_folder(root)
        self.path = parent / f"ppkit-{name}-{os.getpid()}"
        try:
            self.path.mkdir()
        except OSError as exc:
            raise CgroupUnavailable(f"cannot make {self.path}: {exc}") from exc
        self.procs = self.path / "cgroup.procs"
        if limit_bytes is not None:
            try:
                self._limit_file().write_text(str(limit_bytes))
                if self.version == 2 and (self.path / "memory.swap.max").exists():
                    (self.path / "memory.swap.max").write_text("0")  # the limit is memory, not memory + swap
            except OSError as exc:
                self.close()
                raise CgroupUnavailable(f"cannot set a memory limit on {self.path}: {exc}") from exc

    def _limit_file(self) -> Path:
        return self.path / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")

    def add(self, pid: int) -> None:
        self.procs.write_text(str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return []

    def oom_kills(self) -> int:
        name, key = ("memory.events", "oom_kill") if self.version == 2 else ("memory.oom_control", "oom_kill")
        for line in (self.path / name).read_text().splitlines():
            field, _, value = line.partition(" ")
            if field == key:
                return int(value)
        raise CgroupUnavailable(f"{self.path / name} has no {key} line (kernel older than 4.13?)")

    def peak(self) -> int | None:
        """The most memory charged to it at once (v1 max_usage_in_bytes; v2 memory.peak, kernel 5.19+)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def close(self, wait: float = 10.0) -> None:
        """Kill what is still in it, then remove it (retried: a killed process leaves a moment later)."""
        if not self.path.exists():
            return
        deadline = time.monotonic() + wait
        while True:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
