"""Launchers: how a Cluster gets its worker processes, and how it learns how they ended.

``Cluster`` keeps the state machine (starting, ready, broken, closed) and the jobs; a launcher
only starts and stops processes. Each started worker connects back to the controller by itself,
so a launcher never carries a job. Three launchers exist:

- ``ForkServerLauncher`` (this module): a fork server (ppkit/transport/zygote.py) imports torch
  once and forks one worker per rank, on this machine.
- ``RemoteLauncher`` (ppkit/cluster/remote.py): the same for the master's own ranks, plus agents
  on other machines (``ppkit worker``) that fork the remote ranks.
- ``SpawnLauncher`` (ppkit/cluster/spawning.py): each worker a fresh interpreter, no fork at all
  (macOS, Windows, or ``start_method="spawn"`` anywhere).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ppkit.cluster import launch
from ppkit.cluster.inbox import FORK_SERVER, Inbox, Item, LaunchFailed
from ppkit.transport import procs
from ppkit.transport.messages import Exited, ForkServerHello, Kill, Shutdown, Spawn, Spawned

STOP_WAIT_S = 4.0  # how long the fork server gets to stop its workers (SIGTERM, 0.5 s, SIGKILL)


class Launcher:
    """What a Cluster asks of whatever starts its workers. Subclasses start the processes; this
    base class keeps the exit reports (``Spawned``/``Exited`` items) and the local defaults."""

    def __init__(self, world_size: int, inbox: Inbox):
        self.world_size = world_size
        self.tmpdir: Path | None = None  # the processes' files (stores, logs), from bind() to close()
        self.inbox = inbox
        self.local_ranks = list(range(world_size))  # ranks whose pids this machine can signal
        self._spawned: dict[int, tuple] = {}  # rank -> (source, pid) of this generation's process
        self._exit_status: dict[tuple, int] = {}  # (source, pid) -> wait status

    # -- addresses and configuration --------------------------------------------------------
    def server_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def bind(self, address: tuple[str, int]) -> None:
        """The control channel listens on ``address`` now."""
        self.address = address
        self.tmpdir = Path(tempfile.mkdtemp(prefix="ppkit-"))

    def local_env(self) -> dict[str, str]:
        """Environment that puts a process of this machine on the cluster's network."""
        return launch.local_env()

    def init_config(self, rank: int, config: dict, generation: int) -> dict:
        return {**config, "store": ("file", str(self.tmpdir / f"store-{generation}"))}

    def rendezvous_url(self, name: str) -> str:
        """An ``init_method`` URL for a rendezvous that this machine's process hosts."""
        return f"file://{self.tmpdir / name}"

    # -- the life of the workers --------------------------------------------------------------
    def prepare(self) -> None:
        """Start slow preparations early (the fork server's ``import torch``); optional."""

    def accept(self, conn, first) -> bool:
        """A launcher's own process connected with message ``first``; False: not ours."""
        return False

    def begin(self) -> None:
        """Start a generation: forget the last one's processes, get ready to spawn."""
        self._spawned = {}
        self._exit_status = {}

    def can_spawn(self) -> bool:
        return True

    def spawn(self) -> None:
        """Start this generation's workers (called once ``can_spawn()``)."""

    def end_start(self) -> None:
        """Every rank is ready."""

    def stop(self, pids: list[int]) -> None:
        """Stop this generation's workers; ``pids`` are the local ones'."""
        procs.stop_pids(pids, grace=0.5)

    def close(self) -> None:
        """Stop everything this launcher started. Safe to call twice."""
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- exit reports ---------------------------------------------------------------------
    def note(self, item: Item) -> bool:
        """Record a ``Spawned``/``Exited`` report; True if ``item`` was one."""
        key = (item.source, getattr(item.msg, "pid", None))
        if isinstance(item.msg, Spawned):
            self._spawned[item.msg.rank] = key
        elif isinstance(item.msg, Exited):
            # keyed by pid: a previous generation's worker may be reported after restart()
            self._exit_status[key] = item.msg.status
        else:
            return False
        return True

    def exit_status(self, rank: int) -> int | None:
        """How this generation's ``rank`` ended (a wait status), if its launcher said so yet."""
        return self._exit_status.get(self._spawned.get(rank))

    def wait_exit_status(self, rank: int, wait: float = 1.0) -> None:
        """Give the launcher's process a moment to report how ``rank`` ended."""
        self.await_reports(lambda: self.exit_status(rank) is not None, time.monotonic() + wait)

    def await_reports(self, done, deadline: float) -> bool:
        """Read the inbox until ``done()`` (exit reports, which it takes in as they come) or
        ``deadline``; what else arrives is put back for whoever reads next. True if ``done()``."""
        unhandled = []
        while not done() and time.monotonic() < deadline:
            # in slices: next() returns only what is not routine, and exit reports are
            if (item := self.inbox.next(min(deadline, time.monotonic() + 0.05))) is not None:
                unhandled.append(item)
        self.inbox.put_back(unhandled)  # e.g. the fork server's EOF
        return done()

    # -- words for error messages -------------------------------------------------------------
    def rank_label(self, rank: int, info: dict) -> str:
        return f"pid {info.get('pid')}"

    def describe_missing(self, ready: set[int]) -> str:
        return f"rank(s) {[r for r in range(self.world_size) if r not in ready]} to join"

    def timeout_hint(self, ready: set[int]) -> str:
        return "The machine may be overloaded; close other notebooks or raise start_timeout."

    def join_failed_hint(self) -> str:
        return ""


class ForkServerLauncher(Launcher):
    """Workers forked on this machine by a fork server that has imported torch once."""

    def __init__(self, world_size: int, inbox: Inbox, key: bytes):
        super().__init__(world_size, inbox)
        self.key = key
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

    def stop(self, pids: list[int]) -> None:
        """Have the fork server stop this generation's workers and wait for their exit reports.

        Their parent does the signalling (zygote.stop_children): it alone knows which of its pids
        it has not reaped yet; signalling from here could hit a process that reuses the number
        of a worker that already ended. If it does not answer, it goes, and its workers with it.
        """
        ours = set(pids) | {pid for source, pid in self._spawned.values() if source == FORK_SERVER}
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
        """Terminate, then kill; through Popen, which never signals a pid it has reaped."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()

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


def child_env(address: tuple[str, int], key: bytes, **extra: str) -> dict[str, str]:
    """The environment of a process this kernel starts that connects back to ``address``."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(PPKIT_ADDR=f"{address[0]}:{address[1]}", PPKIT_KEY=key.hex(),
               PPKIT_PARENT=str(os.getpid()), PYTHONUNBUFFERED="1", **extra)
    # OpenMP threads that finish early spin-wait for the others by default. With more workers
    # than cores, a spinning thread steals the core its partner needs: a pipeline forward that
    # takes 0.1 s took 2-4 s on 2 cores. Passive waiting sleeps instead. Read once, at torch import.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def start_module(module: str, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """``python -m module`` in its own session (own process group on Windows), so Kernel >
    Interrupt does not reach it; its output goes to ``log_path``."""
    session = ({"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if sys.platform == "win32"
               else {"start_new_session": True})
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", module], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, close_fds=True, **session)
    finally:
        log.close()


def start_fork_server(address: tuple[str, int], key: bytes, log_path: Path) -> subprocess.Popen:
    """Start the fork server (ppkit/transport/zygote.py)."""
    return start_module("ppkit.transport.zygote", child_env(address, key), log_path)
