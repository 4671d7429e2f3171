"""Start methods: how this machine's workers begin, and the launcher that forks nothing.

``forkserver`` (Linux default): a fork server imports torch once and forks each rank
(launchers.py), fast, but forking a process that imported torch is unsafe on macOS and
impossible on Windows. ``spawn``: ``SpawnLauncher`` runs each rank as a fresh interpreter
(``python -m ppkit.transport.fresh``) that connects back over the same authenticated channel and
speaks the same messages. ``auto`` picks spawn on macOS and Windows, the fork server elsewhere.
Chosen by ``ppkit.start(..., start_method=...)`` or, for every cluster of a process (the CLI, CI),
the environment variable PPKIT_START_METHOD.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from ppkit.cluster.inbox import Inbox, Item, LaunchFailed
from ppkit.cluster.launchers import Launcher, child_env, start_module
from ppkit.cluster.remote import make_launcher as make_fork_launcher
from ppkit.errors import ConfigError
from ppkit.transport.messages import Exited, Spawned

START_METHODS = ("auto", "forkserver", "spawn")
START_METHOD_ENV = "PPKIT_START_METHOD"
SPAWNER = "spawner"  # the source of SpawnLauncher's Spawned/Exited items
WORKER_MODULE = "ppkit.transport.fresh"


def check_start_method(value, where: str = "start_method") -> str:
    if value not in START_METHODS:
        raise ConfigError(
            f"unknown {where} {value!r}; the choices are {', '.join(map(repr, START_METHODS))}. "
            "'spawn' starts each worker as a fresh interpreter (works everywhere, slower to start), "
            "'forkserver' forks workers from a process that imported torch once (Linux), "
            "'auto' picks spawn on macOS and Windows and forkserver elsewhere.")
    return value


def resolve_start_method(value: str = "auto", platform: str = sys.platform) -> str:
    """'forkserver' or 'spawn': an explicit ``value`` wins, then $PPKIT_START_METHOD, then the platform."""
    check_start_method(value)
    if value == "auto" and os.environ.get(START_METHOD_ENV):
        value = check_start_method(os.environ[START_METHOD_ENV], START_METHOD_ENV)
    if value == "auto":
        value = "spawn" if platform in ("darwin", "win32") else "forkserver"
    return value


def check_start(start_method: str = "auto", listen: str | None = None) -> str:
    """The start method a cluster with these options uses; ConfigError if they do not go together."""
    method = resolve_start_method(start_method)
    if method == "spawn" and listen is not None:
        raise ConfigError(
            "a cluster across machines (listen=...) forks its workers on every machine, so it needs "
            "start_method='forkserver' (Linux); the spawn start method serves this machine only. "
            f"Pass start_method='forkserver' or unset {START_METHOD_ENV}.")
    return method


def make_launcher(world_size: int, inbox: Inbox, key: bytes, *, start_method: str, listen: str | None,
                  remote, start_timeout: float, backend: str) -> Launcher:
    if check_start(start_method, listen) == "forkserver":
        return make_fork_launcher(world_size, inbox, key, listen=listen, remote=remote,
                                  start_timeout=start_timeout, backend=backend)
    return SpawnLauncher(world_size, inbox, key)


def wait_status(returncode: int) -> int:
    """A ``Popen.returncode`` as the POSIX wait status the exit reports carry."""
    return -returncode if returncode < 0 else (returncode & 0xFF) << 8


class SpawnLauncher(Launcher):
    """Each rank a fresh interpreter started by this kernel; a thread per process reports its exit."""

    def __init__(self, world_size: int, inbox: Inbox, key: bytes):
        super().__init__(world_size, inbox)
        self.key = key
        self.processes: dict[int, subprocess.Popen] = {}  # pid -> process, every generation's
        self._unconnected: dict[int, int] = {}  # rank -> pid, this generation's not connected yet

    def begin(self) -> None:
        super().begin()
        self._unconnected = {}

    def init_config(self, rank: int, config: dict, generation: int) -> dict:
        self._unconnected.pop(rank, None)  # called when the rank's Hello arrives
        return super().init_config(rank, config, generation)

    def spawn(self) -> None:
        for rank in self.local_ranks:
            env = child_env(self.address, self.key, PPKIT_RANK=str(rank))
            process = start_module(WORKER_MODULE, env, self.log_path(rank))
            self.processes[process.pid] = process
            self._unconnected[rank] = process.pid
            self.inbox.put(Item(SPAWNER, Spawned(rank, process.pid)))
            threading.Thread(target=self._report_exit, args=(rank, process), daemon=True,
                             name=f"ppkit-wait-{rank}").start()

    def _report_exit(self, rank: int, process: subprocess.Popen) -> None:
        status = wait_status(process.wait())
        self.inbox.put(Item(SPAWNER, Exited(rank, process.pid, status)))
        if self._unconnected.get(rank) == process.pid:
            # it never reached the controller (a broken install, an import error): say so now
            self.inbox.put(Item(SPAWNER, LaunchFailed(rank, (
                f"rank {rank}'s worker process (pid {process.pid}, `python -m {WORKER_MODULE}`) exited "
                f"before it connected, with code {process.returncode}. Its output "
                f"({self.log_path(rank)}):\n{self.log_tail(rank)}"))))

    def log_tail(self, rank: int) -> str:
        try:
            return self.log_path(rank).read_text(errors="replace")[-1500:] or "(empty)"
        except OSError:
            return "(no log)"

    def stop(self, pids: list[int], grace: float = 0.5) -> None:
        """Terminate, wait up to ``grace`` seconds, then kill (through Popen: portable)."""
        doomed = [self.processes.pop(pid) for pid in pids if pid in self.processes]
        for process in doomed:
            if process.poll() is None:
                process.terminate()
        for process in doomed:
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        self.stop(list(self.processes))
        super().close()

    def log_path(self, rank: int):
        return self.tmpdir / f"rank-{rank}.log"

    def timeout_hint(self, ready: set[int]) -> str:
        tails = [f"rank {rank}'s log:\n{self.log_tail(rank)}" for rank in self.local_ranks if rank not in ready]
        return "\n".join([super().timeout_hint(ready), *tails])
