"""What every launcher is: the members a Cluster uses, and the exit reports they all keep.

``Cluster`` keeps the state machine (starting, ready, broken, closed) and the jobs; a launcher
only starts and stops processes, and says in words what it waits for. Each started worker
connects back to the controller by itself, so a launcher never carries a job. The launchers are
chosen by name (launchers/__init__.py): local.py, spawn.py, remote.py, slurm.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ppkit.cluster import diagnostics, worker_setup
from ppkit.cluster.inbox import Inbox, Item, LaunchFailed
from ppkit.cluster.isolation import KERNEL, Isolation, kernel_isolated
from ppkit.cluster.oom import OomWatch
from ppkit.cluster.spec import ClusterSpec
from ppkit.transport import channel, procs
from ppkit.transport.messages import Exited, FileStoreAt, JoinConfig, Spawned


@dataclass(frozen=True)
class Process:
    """A process a cluster started: a rank's worker, or one that starts workers (a fork server,
    an agent, a SLURM job's srun). ``where``: this machine, a host name, or a SLURM job."""
    role: str
    pid: int | None
    rank: int | None = None
    where: str = "here"


class Launcher:
    """What a Cluster asks of whatever starts its workers. Subclasses start the processes; this
    base class keeps the exit reports (``Spawned``/``Exited`` items) and the local defaults."""

    name = "base"

    def __init__(self, spec: ClusterSpec, inbox: Inbox, key: bytes):
        self.spec = spec
        self.world_size = spec.world_size
        self.key = key
        self.tmpdir: Path | None = None  # the processes' files (stores, logs), from bind() to close()
        self.inbox = inbox
        self.local_ranks = list(range(self.world_size))  # ranks whose pids this machine can signal
        self._spawned: dict[int, tuple] = {}  # rank -> (source, pid) of this generation's process
        self._exit_status: dict[tuple, int] = {}  # (source, pid) -> wait status
        self.oom: OomWatch | None = None  # the local ranks' cgroup's out-of-memory kills, from begin()

    # -- addresses and configuration --------------------------------------------------------
    def server_address(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def bind(self, address: tuple[str, int], on_connect=None) -> None:
        """The control channel listens on ``address`` now; ``on_connect(conn)`` greets a connection
        (for a launcher that listens somewhere of its own too)."""
        self.address = address
        self.tmpdir = Path(tempfile.mkdtemp(prefix="ppkit-"))  # 0700: this user's only

    def isolation(self) -> Isolation:
        """Whether other users of this machine can reach the workers (ppkit/cluster/isolation.py)."""
        if kernel_isolated():  # the isolated kernel: what it starts on this machine shares its network
            return KERNEL
        return Isolation(False, f"launcher={self.name!r} keeps its ranks on the machine's network")

    def local_env(self) -> dict[str, str]:
        """Environment that puts a process of this machine on the cluster's network."""
        return worker_setup.local_env()

    def init_config(self, rank: int, config: JoinConfig, generation: int) -> JoinConfig:
        return replace(config, store=FileStoreAt(str(self.tmpdir / f"store-{generation}")))

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
        self.oom = OomWatch.start() if self.local_ranks else None  # they share this kernel's cgroup

    def can_spawn(self) -> bool:
        return True

    def spawn(self) -> None:
        """Start this generation's workers (called once ``can_spawn()``)."""

    def end_start(self) -> None:
        """Every rank is ready."""

    def settle(self) -> None:
        """Before a job: wait briefly for the news of a process of this launcher that has exited and
        whose closed connection the reader threads have not queued yet. Here: nothing to wait for."""

    def stop(self, workers: dict[int, dict]) -> None:
        """Stop this generation's workers (``workers``: rank -> what its Ready said, pid included)."""
        procs.stop_pids(self.local_pids(workers), grace=0.5)

    def local_pids(self, workers: dict[int, dict]) -> list[int]:
        """The pids of ``workers`` that run on this machine (the ones this process may signal)."""
        return [w["pid"] for r, w in workers.items() if r in self.local_ranks]

    def processes(self) -> list[Process]:
        """The processes this launcher keeps besides the workers (a fork server, agents, a job)."""
        return []

    def close(self) -> None:
        """Stop everything this launcher started. Safe to call twice."""
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    # -- exit reports ---------------------------------------------------------------------
    def note(self, item: Item) -> bool:
        """Take in an item from one of this launcher's own processes (in the thread that reads the
        inbox); True if nothing more needs doing. Here: ``Spawned``/``Exited`` reports."""
        key = (item.source, getattr(item.msg, "pid", None))
        if isinstance(item.msg, Spawned):
            self._spawned[item.msg.rank] = key
        elif isinstance(item.msg, Exited):
            # keyed by pid: a previous generation's worker may be reported after restart()
            self._exit_status[key] = item.msg.status
        else:
            return False
        return True

    def lost(self, item: Item) -> LaunchFailed | None:
        """What an item from this launcher's own processes means for the world: None (nothing), or
        ``LaunchFailed`` (a rank's machine, or with rank None every rank, is lost; with the reason)."""
        return item.msg if isinstance(item.msg, LaunchFailed) else None

    def exit_status(self, rank: int) -> int | None:
        """How this generation's ``rank`` ended (a wait status), if its launcher said so yet."""
        return self._exit_status.get(self._spawned.get(rank))

    def describe_exit(self, rank: int) -> str:
        """How ``rank`` ended, in words; a local rank's out-of-memory kill is named as such."""
        return diagnostics.describe_status(self.exit_status(rank), self.oom if rank in self.local_ranks else None)

    def wait_exit_status(self, rank: int, wait: float = 1.0) -> None:
        """Give the launcher's process a moment to report how ``rank`` ended."""
        self.await_reports(lambda: self.exit_status(rank) is not None, time.monotonic() + wait)

    def await_reports(self, done, deadline: float) -> bool:
        """Read the inbox until ``done()`` (exit reports, which it takes in as they come) or
        ``deadline``; what else arrives is put back for whoever reads next. True if ``done()``."""
        unhandled = []
        while not done() and time.monotonic() < deadline:
            # in slices: next() returns only what is not routine, and exit reports are
            if (item := self.inbox.next(min(deadline, time.monotonic() + 0.01))) is not None:
                unhandled.append(item)
        self.inbox.put_back(unhandled)  # e.g. the fork server's EOF
        return done()

    # -- words for error messages -------------------------------------------------------------
    def script(self) -> str:
        """What was submitted or run to start the workers, as text to read ("" when nothing but ppkit)."""
        return ""

    def describe(self) -> str:
        """How the workers run, for the cluster's repr (e.g. "local", "slurm job 42 on n[1-2]")."""
        return self.name

    def rank_label(self, rank: int, info: dict) -> str:
        return f"pid {info.get('pid')}"

    def describe_missing(self, ready: set[int]) -> str:
        return f"rank(s) {[r for r in range(self.world_size) if r not in ready]} to join"

    def timeout_hint(self, ready: set[int]) -> str:
        return "The machine may be overloaded; close other notebooks or raise start_timeout."

    def join_failed_hint(self) -> str:
        return ""


# Set on every process a launcher starts (and so on the workers a fork server forks): the pid of the process that
# started it. Tools that look for ppkit's processes (the tests' leftover check) go by it, not by command lines.
LAUNCHED_BY_ENV = "PPKIT_LAUNCHED_BY"


def child_env(address: tuple[str, int] | str, key: bytes, **extra: str) -> dict[str, str]:
    """The environment of a process this kernel starts that connects back to ``address`` (a Unix
    socket's path, or host and port)."""
    package_root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(PPKIT_ADDR=channel.format_address(address), PPKIT_KEY=key.hex(),
               PPKIT_PARENT=str(os.getpid()), PYTHONUNBUFFERED="1", **extra)
    env[LAUNCHED_BY_ENV] = str(os.getpid())
    # OpenMP threads that finish early spin-wait for the others by default. With more workers
    # than cores, a spinning thread steals the core its partner needs: a pipeline forward that
    # takes 0.1 s took 2-4 s on 2 cores. Passive waiting sleeps instead. Read once, at torch import.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def start_module(module: str, env: dict[str, str], log_path: Path, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    """``python -m module`` in its own session (own process group on Windows), so Kernel >
    Interrupt does not reach it; its output goes to ``log_path``."""
    session = ({"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if sys.platform == "win32"
               else {"start_new_session": True})
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", module], env=env, stdin=stdin,
                                stdout=log, stderr=subprocess.STDOUT, close_fds=True, **session)
    finally:
        log.close()


