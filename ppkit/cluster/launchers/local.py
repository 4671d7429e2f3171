"""The local launcher: a fork server (ppkit/transport/zygote.py) imports torch once and forks one
worker per rank, on this machine (Linux default; ``launcher="local"``)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from ppkit.cluster.inbox import FORK_SERVER, Closed, Item, LaunchFailed
from ppkit.cluster.launchers.base import Launcher, Process, child_env, start_module
from ppkit.transport import procs
from ppkit.transport.messages import ForkServerHello, Kill, Shutdown, Spawn

STOP_WAIT_S = 4.0  # how long the fork server gets to stop its workers (SIGTERM, 0.5 s, SIGKILL)


class ForkServerLauncher(Launcher):
    """Workers forked on this machine by a fork server that has imported torch once."""

    name = "local"

    def __init__(self, spec, inbox, key: bytes):
        super().__init__(spec, inbox, key)
        self.process: subprocess.Popen | None = None
        self._conn = None
        self._hello = False  # the running fork server has connected
        self._closing = False

    @property
    def fork_server_pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def prepare(self) -> None:
        """Start the fork server now, so that its ``import torch`` overlaps with the kernel's."""
        if self.local_ranks and (self.process is None or self.process.poll() is not None):
            if self._conn is not None:  # the last one died: start afresh
                self._conn.close()
                self._conn = None
            self._hello = False
            # from a thread that outlives the caller's: see procs.in_lasting_thread
            self.process = procs.in_lasting_thread(lambda: start_fork_server(self.address, self.key, self.log_path))
            threading.Thread(target=self._watch, args=(self.process,), name="ppkit-fork-server-wait",
                             daemon=True).start()

    def _watch(self, process: subprocess.Popen) -> None:
        """A fork server that exits before it connects (torch fails to import, a broken install)
        fails the start at once, with its output, as SpawnLauncher does for its workers."""
        code = process.wait()
        if not self._hello and self.process is process and not self._closing:
            self.inbox.put(Item(FORK_SERVER, LaunchFailed(None, (
                f"the fork server (pid {process.pid}, `python -m ppkit.transport.zygote`), which imports "
                f"torch once and forks the workers, exited with code {code} before it connected, so no "
                f"worker could start. Its output ({self.log_path}):\n{self.log_tail()}\nIf torch fails "
                "to import there, check this environment: python -c 'import torch'."))))

    def accept(self, conn, first) -> bool:
        if not isinstance(first, ForkServerHello):
            return False
        self._hello = True
        self._conn = conn
        self.inbox.put(Item(FORK_SERVER, first))  # wakes a start() waiting for it
        self.inbox.read(conn, FORK_SERVER)
        return True

    def begin(self) -> None:
        super().begin()
        self.prepare()

    def can_spawn(self) -> bool:
        return not self.local_ranks or self._conn is not None

    def spawn(self) -> None:
        if self.local_ranks:
            self._conn.send(Spawn(tuple(self.local_ranks)))

    def note(self, item: Item) -> bool:
        return super().note(item) or (item.source == FORK_SERVER and not isinstance(
            item.msg, (Closed, LaunchFailed, ForkServerHello)))

    def lost(self, item: Item) -> LaunchFailed | None:
        if isinstance(item.msg, Closed) and item.source == FORK_SERVER:
            return LaunchFailed(None, (
                f"the fork server (pid {self.fork_server_pid}) that starts the workers died, and the "
                f"workers with it. Its log ({self.log_path}) ends with:\n{self.log_tail()}"))
        return super().lost(item)

    def processes(self) -> list[Process]:
        return [Process("fork server", self.fork_server_pid)] if self.fork_server_pid else []

    def describe_missing(self, ready: set[int]) -> str:
        return "the fork server" if not self.can_spawn() else super().describe_missing(ready)

    def stop(self, workers: dict[int, dict]) -> None:
        """Have the fork server stop this generation's workers and wait for their exit reports.

        Their parent does the signalling (zygote.stop_children): it alone knows which of its pids
        it has not reaped yet; signalling from here could hit a process that reuses the number
        of a worker that already ended. If it does not answer, it goes, and its workers with it.
        """
        ours = set(self.local_pids(workers)) | {pid for source, pid in self._spawned.values() if source == FORK_SERVER}
        if not ours or self._conn is None or self.process is None or self.process.poll() is not None:
            return  # no fork server: its workers died with it (PR_SET_PDEATHSIG)
        try:
            self._conn.send(Kill())
        except OSError:
            return
        if not self.await_reports(lambda: all((FORK_SERVER, pid) in self._exit_status for pid in ours),
                                  time.monotonic() + STOP_WAIT_S):
            self._stop_fork_server(grace=0.0)  # stopped (SIGSTOP) or hung: prepare() starts another

    def _stop_fork_server(self, grace: float) -> None:
        procs.stop_processes([self.process], grace)

    def close(self) -> None:
        self._closing = True
        if self.process is not None:
            try:
                self._conn and self._conn.send(Shutdown())
            except OSError:
                pass
            self._stop_fork_server(grace=1.0)
        if self._conn is not None:
            self._conn.close()
        super().close()

    @property
    def log_path(self) -> Path:
        return self.tmpdir / "zygote.log"

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    def timeout_hint(self, ready: set[int]) -> str:
        return f"{super().timeout_hint(ready)}\nFork server log:\n{self.log_tail()}"




def start_fork_server(address: tuple[str, int], key: bytes, log_path: Path) -> subprocess.Popen:
    """Start the fork server (ppkit/transport/zygote.py)."""
    return start_module("ppkit.transport.zygote", child_env(address, key), log_path)
