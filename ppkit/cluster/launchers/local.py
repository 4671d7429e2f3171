"""The local launcher: a fork server (ppkit/transport/zygote.py) imports torch once and forks one
worker per rank, on this machine (Linux default; ``launcher="local"``).

Where the machine allows it (ppkit/cluster/isolation.py), the fork server and so every worker run in
a private network of their own, which other users of the machine cannot reach; they connect back
through a Unix socket in this cluster's own folder (0700) rather than 127.0.0.1.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from ppkit.cluster import isolation
from ppkit.cluster.inbox import FORK_SERVER, Closed, Item, LaunchFailed
from ppkit.cluster.launchers import spare
from ppkit.cluster.launchers.base import Launcher, Process, child_env, start_module
from ppkit.errors import LaunchError
from ppkit.transport import channel, procs
from ppkit.transport.messages import ForkServerHello, Kill, Shutdown, Spawn

STOP_WAIT_S = 4.0  # how long the fork server gets to stop its workers (SIGTERM, 0.5 s, SIGKILL)
SETTLE_S = 5.0  # at most, how long a job waits for the closed connection of a fork server that has exited


class ForkServerLauncher(Launcher):
    """Workers forked on this machine by a fork server that has imported torch once."""

    name = "local"

    def __init__(self, spec, inbox, key: bytes):
        super().__init__(spec, inbox, key)
        self.process: subprocess.Popen | None = None
        self._conn = None
        self._hello = False  # the running fork server has connected
        self._closing = False
        self._mode, self._required, self._off_reason = isolation.resolve(spec.isolation, self.name)
        self._refused = ""  # why the running fork server has no private network ("" if it has one)
        self._unix_server: channel.ChannelServer | None = None
        self._started_as: tuple = ()  # spare.fingerprint() of where the running fork server started
        # set once the running fork server's connection has closed and been queued: one per connection, so that
        # the reader of an earlier fork server, ending late, cannot mark the running one's as read
        self._read_all = threading.Event()

    def bind(self, address, on_connect=None) -> None:
        super().bind(address, on_connect)
        if self._mode != "netns":
            return
        path = self.tmpdir / "control.sock"  # reachable from a private network: a file, not an address
        try:
            self._unix_server = channel.ChannelServer("", 0, self.key, on_connect, unix_path=str(path))
        except OSError as exc:  # e.g. a TMPDIR so long that the path does not fit a Unix socket's address
            self._off_reason = f"no Unix socket for the workers at {path} ({exc})"
            self._mode = "netns" if self._required else "off"  # required: prepare() says why it cannot start

    @property
    def fork_server_address(self):
        return self._unix_server.address if self._unix_server is not None else self.address

    def isolation(self) -> isolation.Isolation:
        if self._mode == "kernel":
            return isolation.KERNEL
        if self._mode == "off":
            return isolation.Isolation(False, self._off_reason)
        if self._refused:
            isolation.fell_back(self._refused)
            return isolation.Isolation(False, f"this machine refused a private network ({self._refused})")
        return isolation.Isolation(True)

    @property
    def fork_server_pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def prepare(self) -> None:
        """Start the fork server now, so that its ``import torch`` overlaps with the kernel's."""
        if self._mode == "netns" and self._unix_server is None:
            raise LaunchError(isolation.refused(self._off_reason))
        if self.local_ranks and (self.process is None or procs.exited(self.process)):
            if self._conn is not None:  # the last one died: start afresh
                self._conn.close()
                self._conn = None
            self._hello = False
            taken = spare.take(self._mode, self.fork_server_address, self.key, self.log_path)  # a closed one's
            if taken is not None:
                self.process, self._started_as = taken
            else:  # from a thread that outlives the caller's: see procs.in_lasting_thread
                self._started_as = spare.fingerprint(self._mode)
                self.process = procs.in_lasting_thread(lambda: start_fork_server(
                    self.fork_server_address, self.key, self.log_path, self._mode))
            threading.Thread(target=self._watch, args=(self.process,), name="ppkit-fork-server-wait",
                             daemon=True).start()

    def _watch(self, process: subprocess.Popen) -> None:
        """A fork server that exits before it connects (torch fails to import, a broken install)
        fails the start at once, with its output, as SpawnLauncher does for its workers. Once it has
        connected, its end comes as its connection's close, and this thread ends (a parked fork server
        outlives its cluster: spare.py)."""
        while True:
            try:
                code = process.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if (self._hello and self.process is process) or self._closing:
                    return
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
        self._refused = first.isolation if self._mode == "netns" else ""
        if self._refused and self._required:
            self.inbox.put(Item(FORK_SERVER, LaunchFailed(None, isolation.refused(self._refused))))
            return True
        read_all = self._read_all = threading.Event()
        self.inbox.put(Item(FORK_SERVER, first))  # wakes a start() waiting for it
        try:
            self.inbox.read(conn, FORK_SERVER)
        finally:
            read_all.set()
        return True

    def settle(self) -> None:
        """A fork server that exited between jobs breaks the cluster with its own reason, not with the
        first rank whose closed connection a job would meet: wait (at most SETTLE_S; only when it has
        exited) until the reader thread has queued its connection's close."""
        if self._hello and self.process is not None and procs.exited(self.process):
            self._read_all.wait(SETTLE_S)

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
        some = set(workers) < set(self._spawned)  # only these ranks (the others stay: a post-mortem)
        ours = set(self.local_pids(workers)) | {pid for rank, (source, pid) in self._spawned.items()
                                                if source == FORK_SERVER and (not some or rank in workers)}
        if not ours or self._conn is None or self.process is None or procs.exited(self.process):
            return  # no fork server: its workers died with it (PR_SET_PDEATHSIG)
        try:
            self._conn.send(Kill(tuple(sorted(workers)) if some else ()))
        except OSError:
            return
        if not self.await_reports(lambda: all((FORK_SERVER, pid) in self._exit_status for pid in ours),
                                  time.monotonic() + STOP_WAIT_S):
            self._stop_fork_server(grace=0.0)  # stopped (SIGSTOP) or hung: prepare() starts another

    def _stop_fork_server(self, grace: float) -> None:
        procs.stop_processes([self.process], grace)

    def close(self) -> None:
        self._closing = True
        if self.process is not None and not self._park():
            try:
                self._conn and self._conn.send(Shutdown())
            except OSError:
                pass
            self._stop_fork_server(grace=1.0)
        if self._conn is not None:
            self._conn.close()
        if self._unix_server is not None:
            self._unix_server.close()
        super().close()

    def _park(self) -> bool:
        """Leave the fork server, its workers stopped, for the next cluster to fork from (spare.py)."""
        seconds = spare.park_seconds()
        if not (seconds and self._hello and self._conn is not None and not procs.exited(self.process)
                and self._exit_status_complete()):
            return False
        try:
            self._conn.send(Shutdown(park_s=seconds))
        except OSError:
            return False
        spare.keep(self.process, self._started_as, seconds)
        return True

    def _exit_status_complete(self) -> bool:
        """Every process it forked has been reported gone (stop() waited for that, or it was killed)."""
        forked = {pid for source, pid in self._spawned.values() if source == FORK_SERVER}
        return all((FORK_SERVER, pid) in self._exit_status for pid in forked)

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


def start_fork_server(address, key: bytes, log_path: Path, mode: str = "off") -> subprocess.Popen:
    """Start the fork server (ppkit/transport/zygote.py); ``mode`` "netns": in a private network."""
    return start_module("ppkit.transport.zygote", child_env(address, key, PPKIT_ISOLATION=mode), log_path,
                        stdin=subprocess.PIPE)  # for handing it on to another cluster (spare.py)
