"""The spawn launcher: each rank a fresh interpreter (``python -m ppkit.transport.fresh``) that
connects back over the same authenticated channel and speaks the same messages; no fork at all
(macOS, Windows, or ``launcher="spawn"`` / ``start_method="spawn"`` anywhere)."""

from __future__ import annotations

import subprocess
import threading

from ppkit.cluster.inbox import Item, LaunchFailed
from ppkit.cluster.launchers.base import Launcher, Process, child_env, start_module
from ppkit.transport import procs
from ppkit.transport.messages import Exited, JoinConfig, Spawned

SPAWNER = "spawner"  # the source of SpawnLauncher's Spawned/Exited items
WORKER_MODULE = "ppkit.transport.fresh"


def wait_status(returncode: int) -> int:
    """A ``Popen.returncode`` as the POSIX wait status the exit reports carry."""
    return -returncode if returncode < 0 else (returncode & 0xFF) << 8


class SpawnLauncher(Launcher):
    """Each rank a fresh interpreter started by this kernel; a thread per process reports its exit."""

    name = "spawn"

    def __init__(self, spec, inbox, key: bytes):
        super().__init__(spec, inbox, key)
        self.popens: dict[int, subprocess.Popen] = {}  # pid -> process, every generation's
        self._unconnected: dict[int, int] = {}  # rank -> pid, this generation's not connected yet

    def begin(self) -> None:
        super().begin()
        self._unconnected = {}

    def init_config(self, rank: int, config: JoinConfig, generation: int) -> JoinConfig:
        self._unconnected.pop(rank, None)  # called when the rank's Hello arrives
        return super().init_config(rank, config, generation)

    def spawn(self) -> None:
        for rank in self.local_ranks:
            env = child_env(self.address, self.key, PPKIT_RANK=str(rank))
            process = start_module(WORKER_MODULE, env, self.log_path(rank))
            self.popens[process.pid] = process
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

    def stop(self, workers: dict[int, dict], grace: float = 0.5) -> None:
        """Terminate, wait up to ``grace`` seconds, then kill (through Popen: portable)."""
        self._stop(self.local_pids(workers), grace)

    def _stop(self, pids: list[int], grace: float = 0.5) -> None:
        procs.stop_processes([self.popens.pop(pid) for pid in pids if pid in self.popens], grace)

    def processes(self) -> list[Process]:
        return [Process("worker", pid) for pid, p in self.popens.items() if p.poll() is None]

    def close(self) -> None:
        self._stop(list(self.popens))
        super().close()

    def log_path(self, rank: int):
        return self.tmpdir / f"rank-{rank}.log"

    def timeout_hint(self, ready: set[int]) -> str:
        tails = [f"rank {rank}'s log:\n{self.log_tail(rank)}" for rank in self.local_ranks if rank not in ready]
        return "\n".join([super().timeout_hint(ready), *tails])
