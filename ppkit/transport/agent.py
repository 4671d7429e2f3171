"""The remote agent: what ``ppkit worker`` runs on another machine.

It is the fork server (``zygote``) of a remote host. It connects to the master's control channel,
says who it is (its name, host and Python/torch/ppkit versions), and once admitted forks one
worker process per rank the master asks for. The workers connect back to the master like local
ones. The agent reports how each worker ended ("killed by SIGKILL"), kills its workers when the
master restarts the world, and exits, with its workers, when the master closes the cluster, goes
away, or stops answering: master and agent send each other a heartbeat (heartbeat.py), so a
master that lost power or its network is noticed within ``heartbeat.SILENT_AFTER_S``.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

from ppkit.errors import AuthenticationError, LaunchError
from ppkit.transport import channel, heartbeat, ifaces, worker, zygote
from ppkit.transport.messages import Admitted, AgentHello, AgentInfo, Kill, Reject, Shutdown, Spawn, Spawned

RETRY_EVERY_S = 1.0
ANSWER_WAIT_S = 60.0  # for the answer to our hello: a master that imports torch to check versions is slow
_FATAL_ERRNOS = (errno.ENETUNREACH,)  # no route at all: retrying will not help


def connect(address: tuple[str, int], key: bytes, timeout: float):
    """Connect to the master, retrying while it is not up yet; raise ``LaunchError`` at the deadline."""
    deadline = time.monotonic() + timeout
    where = f"{address[0]}:{address[1]}"
    while True:
        left = deadline - time.monotonic()
        try:
            return channel.connect(address, key, timeout=max(0.5, min(5.0, left)))
        except AuthenticationError:
            raise
        except OSError as exc:
            last = exc
            if exc.errno in _FATAL_ERRNOS or left <= RETRY_EVERY_S:
                break
        time.sleep(RETRY_EVERY_S)
    reason = last.strerror or str(last)
    raise LaunchError(
        f"could not reach the master at {where}: {reason} (tried for {timeout:.0f} s). Check that "
        f"the master is running and listening on that address, that this machine has a route to "
        f"it and that no firewall blocks port {address[1]}: run `ppkit doctor --master {where}` "
        "here.") from last


def choose_interface(requested: str | None, local_address: str) -> str | None:
    """The interface gloo and TensorPipe should use: the one asked for, else the one that reached
    the master (``GLOO_SOCKET_IFNAME`` already set in the environment is kept)."""
    if requested:
        if requested not in ifaces.interfaces():
            raise LaunchError(
                f"there is no network interface {requested!r} on this machine; it has "
                f"{', '.join(ifaces.interfaces())}. Run `ppkit doctor` to see their addresses.")
        return requested
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    return ifaces.interface_of(local_address)


class Agent:
    def __init__(self, address: tuple[str, int], key: bytes, name: str, *, iface: str | None = None,
                 connect_timeout: float = 60.0, say=print, ranks: list[int] | None = None):
        self.address, self.key, self.name, self.say = address, key, name, say
        self.ranks = ranks  # the ranks this machine holds, when its launcher says (SLURM: a node's)
        self.conn = connect(address, key, connect_timeout)
        sock = socket.socket(fileno=os.dup(self.conn.fileno()))
        try:
            self.local_address = sock.getsockname()[0]
        finally:
            sock.close()
        self.iface = choose_interface(iface, self.local_address)
        if self.iface:
            os.environ.update(ifaces.socket_env(self.iface))  # inherited by every worker we fork
        self._lock = threading.Lock()
        self._children: dict[int, int] = {}
        self._have_children = threading.Condition()
        self._pulse = heartbeat.Pulse(self.conn, self._lock, beating=False)  # beats once admitted

    def hello(self) -> AgentInfo:
        addrs = ifaces.interfaces().get(self.iface, []) if self.iface else []
        return AgentInfo(name=self.name, host=socket.gethostname(), pid=os.getpid(), versions=worker.versions(),
                         iface=self.iface, iface_addrs=tuple(addrs), local_address=self.local_address,
                         ranks=tuple(self.ranks or ()))

    def join(self) -> Admitted:
        """Introduce ourselves; return the master's answer or raise ``LaunchError`` if refused."""
        where = f"{self.address[0]}:{self.address[1]}"
        import torch  # noqa: F401  (once here, in the main thread: every rank we fork starts with it)

        self.conn.send(AgentHello(self.hello()))
        try:
            # a master of our ppkit version sends heartbeats at once; another one only its answer
            if not self.conn.poll(ANSWER_WAIT_S):
                raise heartbeat.PeerSilent(ANSWER_WAIT_S)
            reply = heartbeat.receive(self.conn)
        except (EOFError, OSError) as exc:
            raise LaunchError(
                f"the master at {where} closed the connection before admitting this worker.") from exc
        except heartbeat.PeerSilent as exc:
            raise LaunchError(
                f"the master at {where} stopped answering before admitting this worker: {exc}. "
                "Is its notebook kernel busy or paused? Start this worker again.") from exc
        if isinstance(reply, Reject):
            raise LaunchError(f"the master refused {self.name}: {reply.reason}")
        if not isinstance(reply, Admitted):
            raise LaunchError(f"the master at {where} answered {reply!r:.80} instead of admitting this "
                              "worker: is it the same ppkit version?")
        return reply

    def serve(self) -> tuple[bool, str]:
        """Fork workers on request until the master closes; return (closed cleanly?, why we stopped)."""
        # exit_when_lost=False: after the master's "shutdown" our reports may meet a closed
        # connection; that must not turn a clean exit into exit code 1 (seen in CI)
        threading.Thread(target=zygote._reap, args=(self.conn, self._children, self._lock,
                                                     self._have_children, False), daemon=True).start()
        self._pulse = heartbeat.Pulse(self.conn, self._lock)
        while True:
            try:
                msg = heartbeat.receive(self.conn)
            except (EOFError, OSError):
                self.stop_children()
                return False, "the master went away (its connection closed)"
            except heartbeat.PeerSilent as exc:
                self.stop_children()
                return False, (
                    f"the master at {self.address[0]}:{self.address[1]} stopped answering ({exc}): its "
                    "machine froze, lost power or left the network, or the network between the machines "
                    "failed. Stopped this machine's ranks; start `ppkit worker` again once the master is back")
            if isinstance(msg, Spawn):
                self.stop_children()
                for rank in msg.ranks:
                    self._fork(rank)
            elif isinstance(msg, Kill):
                self.stop_children()
            elif isinstance(msg, Shutdown):
                self.stop_children()
                return True, msg.reason or "the master closed the cluster"

    def _fork(self, rank: int) -> None:
        with self._have_children:  # held across fork so the reaper cannot miss the pid
            pid = os.fork()
            if pid == 0:
                zygote._child(self.conn, self.address, self.key, rank, os.getppid())
            self._children[pid] = rank
            self._have_children.notify()
        self.say(f"{self.name}: started rank {rank} (pid {pid})")
        with self._lock:
            self.conn.send(Spawned(rank, pid))

    def stop_children(self) -> None:
        zygote.stop_children(self._children, self._have_children, grace=1.0)  # never a reaped pid

    def close(self) -> None:
        self.stop_children()
        self._pulse.close()
