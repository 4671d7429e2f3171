"""Remote workers: a Cluster that listens on a network address and admits workers by name.

``Cluster(2, listen="10.0.0.1:29600")`` keeps rank 0 on this machine and waits for ``worker1``
(rank 1), started on the other machine with ``ppkit worker --connect 10.0.0.1:29600 --name
worker1``. That command runs an *agent* (ppkit/transport/agent.py) which, once admitted, forks the
rank's worker process on request, so ``restart()`` works across machines too.

Admission happens here, before anything runs: a worker is refused with a message on both machines
if its name is not expected, or its Python/torch/ppkit versions differ from the master's (the
mismatch seed 000 warns about), or it would advertise a loopback address to gloo. Ranks follow the
order of the names, not the order in which workers connect. In listen mode the rendezvous store is
a TCPStore hosted by the controller on the listen address (local mode keeps its FileStore and
127.0.0.1-only sockets).
"""

from __future__ import annotations

import errno
import os
import re
import socket
import threading
from datetime import timedelta

from ppkit.errors import ConfigError, LaunchError
from ppkit.transport import channel, ifaces, worker

_NAME = re.compile(r"[A-Za-z0-9_-]+")
DEFAULT_PORT = 29600  # away from torchrun's 29500 (MASTER_PORT) and 29400 (c10d rendezvous)


def parse_listen(text) -> tuple[str, int]:
    """``"ADDR:PORT"`` (or ``"ADDR"`` for the default port) -> ``(addr, port)``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"listen must be 'ADDR:PORT', e.g. '10.0.0.1:{DEFAULT_PORT}', got {text!r}.")
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = port, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(
            f"listen must be 'ADDR:PORT' with a port from 0 to 65535, e.g. '10.0.0.1:{DEFAULT_PORT}', "
            f"got {text!r}.")
    try:
        host = socket.gethostbyname(host.strip("[]"))
    except OSError as exc:
        raise ConfigError(f"cannot resolve the listen address {host!r}: {exc}.") from exc
    return host, int(port)


def parse_key(key) -> bytes:
    """The control channel's key: given (bytes or hex), else $PPKIT_KEY, else a new random one."""
    if key is None:
        key = os.environ.get(channel.KEY_ENV)
        if not key:
            return channel.new_key()
    if isinstance(key, bytes):
        if len(key) < 16:
            raise ConfigError(f"the key must be at least 16 bytes long, got {len(key)}.")
        return key
    try:
        return parse_key(bytes.fromhex(key))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            "the key must be hex digits, such as the PPKIT_KEY the master prints (or bytes); got "
            f"{type(key).__name__} of length {len(key) if hasattr(key, '__len__') else '?'}.") from exc


def remote_names(world_size: int, remote) -> list[str]:
    """The names of the remote workers, in rank order (``remote`` is a count, names, or a mapping)."""
    if remote is None:
        remote = world_size - 1
    if isinstance(remote, bool):
        raise ConfigError(f"remote must be a number of workers or a list of names, got {remote!r}.")
    if isinstance(remote, int):
        names = [f"worker{i}" for i in range(1, remote + 1)]
    elif isinstance(remote, (list, tuple, dict)):
        names = list(remote)
    else:
        raise ConfigError(
            f"remote must be a number of workers, a list of names such as ['worker1'], or a mapping "
            f"name -> ssh host, got {type(remote).__name__}.")
    bad = [n for n in names if not isinstance(n, str) or not _NAME.fullmatch(n)]
    if bad:
        raise ConfigError(f"worker names must be words like 'worker1', got {bad!r}.")
    if len(set(names)) != len(names):
        raise ConfigError(f"worker names must be different from each other, got {names!r}.")
    if not 1 <= len(names) <= world_size:
        raise ConfigError(
            f"a world of {world_size} rank(s) has room for 1 to {world_size} remote workers, "
            f"not {len(names)} ({names}). Raise world_size or name fewer workers.")
    return names


def rpc_remote_names(worker_names: list[str], remote):
    """Which workers of an RPC world are remote: the last ones (all of them by default).

    RPC names follow ranks (worker1, worker2, ...) and remote ranks come after local ones, so
    ``remote`` may be a count, or names (or a name -> ssh host mapping) ending the list.
    """
    if remote is None:
        return list(worker_names)
    names = remote_names(len(worker_names), remote)
    if isinstance(remote, int):  # a count: the last ones
        return worker_names[len(worker_names) - len(names):]
    if names != worker_names[len(worker_names) - len(names):]:
        raise ConfigError(
            f"in an RPC world the remote workers are the last ones, named by rank: with "
            f"{len(worker_names)} workers and {len(names)} remote, remote="
            f"{worker_names[len(worker_names) - len(names):]}, not {names}.")
    return remote if isinstance(remote, dict) else names  # a mapping also says where to ssh


def without_socket_vars(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ifaces.SOCKET_ENV_VARS}


def version_problem(ours: dict, theirs: dict, name: str) -> str | None:
    """Why a worker with versions ``theirs`` cannot join a master with ``ours``, or None.

    Python must agree on major.minor (functions travel as bytecode), torch and ppkit exactly.
    """
    def same(key):
        a, b = str(ours.get(key)), str(theirs.get(key))
        return a.split(".")[:2] == b.split(".")[:2] if key == "python" else a == b

    diffs = [k for k in ("python", "torch", "ppkit") if not same(k)]
    if not diffs:
        return None
    listed = ", ".join(f"{k} {theirs.get(k)} (the master has {ours.get(k)})" for k in diffs)
    pins = " ".join(f"{k}=={ours.get(k)}" for k in diffs if k != "python")
    return (
        f"{name} on {theirs.get('host', '?')} runs {listed}. Every machine must run the same Python "
        "(major.minor), torch and ppkit: functions and tensors travel between them pickled, and "
        "torch.distributed needs the same torch on every rank. "
        + (f"Install the master's versions there (pip install {pins}) " if pins else
           "Use the same Python version there ")
        + "and start the worker again; `ppkit version` prints them on each machine.")


def interface_problem(info: dict, master_host: str) -> str | None:
    """Why a worker's gloo/TensorPipe interface cannot work with this master, or None."""
    addrs = info.get("iface_addrs") or []
    if ifaces.is_loopback(master_host) or not addrs or not all(ifaces.is_loopback(a) for a in addrs):
        return None
    reached = info.get("local_address")
    return (
        f"{info.get('name')} on {info.get('host')} would use interface {info.get('iface')!r} "
        f"({', '.join(addrs)}) for gloo and TensorPipe, a loopback address that the master "
        f"({master_host}) cannot reach, so joining the process group would hang. It reached the "
        f"master from {reached}: start it with --iface naming that address's interface, or unset "
        "GLOO_SOCKET_IFNAME/TP_SOCKET_IFNAME there (`ppkit doctor` lists the interfaces).")


class RemoteWorkers:
    """The controller's side of remote workers: admission, rank assignment, the TCPStore."""

    def __init__(self, world_size: int, listen: str, remote, key: bytes, inbox, start_timeout: float,
                 backend: str = "gloo"):
        if backend != "gloo":
            raise ConfigError(
                f"remote workers use the gloo backend (CPU tensors between machines), not {backend!r}. "
                "Pass backend='gloo' or 'auto' with listen=....")
        self.world_size = world_size
        self.host, self.port = parse_listen(listen)
        self.names = remote_names(world_size, remote)
        self.ssh_hosts = {n: h for n, h in remote.items() if h} if isinstance(remote, dict) else {}
        self.first_remote_rank = world_size - len(self.names)
        self.rank_of = {name: self.first_remote_rank + i for i, name in enumerate(self.names)}
        self.name_of = {rank: name for name, rank in self.rank_of.items()}
        self.key = key
        self._inbox = inbox
        self._start_timeout = start_timeout
        self._lock = threading.RLock()  # guards self.agents and every send to an agent
        self._spawning = False
        self.agents: dict[str, tuple] = {}  # name -> (conn, info)
        self._store = None
        self._store_port = None
        self._ssh_procs: dict[str, object] = {}
        self.iface = self._master_interface()

    def _master_interface(self) -> str:
        if self.host == "0.0.0.0":
            raise ConfigError(
                "listen='0.0.0.0:PORT' does not say which address the workers should use for the "
                "rendezvous store and gloo. Listen on the address the other machines reach (e.g. "
                "listen='10.0.0.1:29600'; `ppkit doctor` lists this machine's addresses).")
        iface = ifaces.interface_of(self.host)
        if iface is None and not ifaces.is_loopback(self.host):
            have = ", ".join(f"{n} {' '.join(a)}" for n, a in ifaces.interfaces().items() if a)
            raise ConfigError(
                f"{self.host} is not an address of this machine, so the master cannot listen on it "
                f"(this machine has: {have}). Pass listen='ADDR:PORT' with one of these addresses.")
        return iface or ifaces.interface_of("127.0.0.1") or "lo"

    # -- what the controller asks ---------------------------------------------------------------
    @property
    def local_ranks(self) -> list[int]:
        return list(range(self.first_remote_rank))

    def is_remote(self, rank: int) -> bool:
        return rank in self.name_of

    def local_env(self) -> dict[str, str]:
        """Environment of the master's own ranks: gloo on the listen address's interface."""
        return {**ifaces.socket_env(self.iface), "MASTER_ADDR": self.host}

    def server_address(self) -> tuple[str, int]:
        return self.host, self.port

    def join_command(self, name: str) -> str:
        """What to type on the worker's machine."""
        return (f"PPKIT_KEY={self.key.hex()} ppkit worker --connect {self.host}:{self.port} "
                f"--name {name}")

    def init_config(self, rank: int, config: dict) -> dict:
        config = {**config, "store": ("tcp", self.host, self._store_port)}
        if self.is_remote(rank):
            # the worker's own machine decides its interface (ppkit worker --iface) and paths
            config.update(env=without_socket_vars(config["env"]), cwd=None, sys_path=[], device="cpu",
                          name=self.name_of[rank])
        return config

    def rendezvous_url(self) -> str:
        """A ``tcp://`` init_method on the listen address, for a rendezvous that rank 0 hosts."""
        with socket.socket() as sock:
            sock.bind((self.host, 0))
            return f"tcp://{self.host}:{sock.getsockname()[1]}"

    def rank_label(self, rank: int, info: dict) -> str:
        if not self.is_remote(rank):
            return f"pid {info.get('pid')}"
        return f"{self.name_of[rank]} on {info.get('host', '?')}, pid {info.get('pid')}"

    # -- admission (runs in the connection's reader thread) ----------------------------------
    def on_agent(self, conn, info: dict) -> None:
        name = info.get("name")
        problem = self._problem(name, info)  # slow checks first, outside the lock
        with self._lock:
            refusal, fatal = self._refusal(name, info) if problem is None else (problem, True)
            if refusal is None:
                self.agents[name] = (conn, info)
                self._send(conn, ("admitted", {"rank": self.rank_of[name], "world_size": self.world_size,
                                               "master": f"{self.host}:{self.port}"}))
                if self._spawning:
                    self._spawn(name)
        if refusal is not None:
            self._send(conn, ("reject", refusal))
            conn.close()
            if fatal:
                self._inbox.put(("remote", self.rank_of[name], f"the master refused {name}: {refusal}",
                                 None))
            return
        self._serve_agent(name, conn, info)

    def _problem(self, name, info) -> str | None:
        """Why an expected worker cannot work with this master (versions, interface), or None."""
        if name not in self.rank_of:
            return None
        return version_problem(worker.versions(), info, name) or interface_problem(info, self.host)

    def _refusal(self, name, info) -> tuple[str | None, bool]:
        if name not in self.rank_of:
            why = (f"this cluster expects the worker(s) {', '.join(self.names)}, not {name!r}. "
                   f"Start the worker with --name {self.names[0]} (or another expected name).")
            return why, False
        if name in self.agents:
            other = self.agents[name][1]
            why = (f"{name} has already joined from {other.get('host')} (pid {other.get('pid')}). "
                   "Stop that worker first, or give this one another expected name.")
            return why, False
        return None, False

    def _serve_agent(self, name: str, conn, info: dict) -> None:
        rank = self.rank_of[name]
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] in ("spawned", "exited"):
                # in the fork server's words, so the controller reads them as such; the pid is
                # tagged with the worker's name, as pids of different machines may coincide
                kind, rank_, pid, *rest = msg
                self._inbox.put(("msg", "zygote", (kind, rank_, (name, pid), *rest), None))
        with self._lock:
            if self.agents.get(name, (None,))[0] is conn:
                del self.agents[name]
        conn.close()
        self._inbox.put(("remote", rank, (
            f"{name} on {info.get('host')} disconnected: its `ppkit worker` process stopped or the "
            "network between the machines failed. Start it again, then run cluster.restart()."), None))

    # -- start, restart, close -----------------------------------------------------------------
    def begin_start(self, say=print) -> None:
        """A fresh store for this generation; ask every joined agent to fork its rank."""
        self._new_store()
        with self._lock:
            self._spawning = True
            missing = [n for n in self.names if n not in self.agents]
            for name in self.agents:
                self._spawn(name)
        self._start_ssh(missing)
        hand = [n for n in missing if n not in self.ssh_hosts]
        if hand:
            say(f"Waiting for {', '.join(hand)} to join {self.host}:{self.port}. On each worker's "
                "machine run:\n" + "\n".join(f"  {self.join_command(n)}" for n in hand), flush=True)

    def end_start(self) -> None:
        with self._lock:
            self._spawning = False

    def _spawn(self, name: str) -> None:
        self._send(self.agents[name][0], ("spawn", [self.rank_of[name]]))

    def _send(self, conn, msg) -> None:
        with self._lock:
            try:
                conn.send(msg)
            except OSError:
                pass  # the agent is gone; its reader thread reports that

    def _joined(self) -> dict[str, dict]:
        with self._lock:
            return {name: info for name, (_, info) in self.agents.items()}

    def _new_store(self) -> None:
        import torch.distributed as dist

        self._store = None  # the old one stops serving (it owns and closes its socket)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((self.host, 0))  # this address only, not every interface
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        self._store = dist.TCPStore(
            self.host, 0, self.world_size, is_master=True, wait_for_workers=False,
            timeout=timedelta(seconds=self._start_timeout), master_listen_fd=sock.detach())
        self._store_port = self._store.port

    def describe_missing(self, ready: set[int]) -> str:
        parts = []
        local = [r for r in self.local_ranks if r not in ready]
        if local:
            parts.append(f"local rank(s) {local}")
        joined = self._joined()
        for name in self.names:
            rank = self.rank_of[name]
            if rank in ready:
                continue
            if name in joined:
                info = joined[name]
                parts.append(f"{name} (rank {rank} of {self.world_size}, on {info.get('host')}, "
                             f"interface {info.get('iface')} {' '.join(info.get('iface_addrs') or [])}) "
                             "to join the process group")
            else:
                parts.append(f"{name} (rank {rank} of {self.world_size}) to connect")
        return ", ".join(parts)

    def timeout_hint(self, ready: set[int]) -> str:
        where = f"{self.host}:{self.port}"
        joined = self._joined()
        absent = [n for n in self.names if n not in joined and self.rank_of[n] not in ready]
        stuck = [n for n in self.names if n in joined and self.rank_of[n] not in ready]
        hints = []
        if absent:
            hints.append(
                f"{', '.join(absent)} never connected to the master at {where}. Start it on its machine "
                f"({self.join_command(absent[0])}); if it is running, check that it can reach {where} "
                f"(`ppkit doctor --master {where}` there) and that no firewall blocks the port."
                + self._ssh_tail(absent))
        if stuck:
            hints.append(
                f"{', '.join(stuck)} connected but never finished joining the process group: gloo "
                "could not connect the machines' ranks to each other. That usually means "
                "GLOO_SOCKET_IFNAME (`ppkit worker --iface`) names an interface the other machine "
                f"cannot reach; the master uses {self.iface} ({self.host}). A firewall that allows "
                "only the master's port has the same effect: gloo also opens connections on other ports.")
        return " ".join(hints)

    def join_failed_hint(self) -> str:
        """Why a rank may fail to join a process group that spans machines."""
        uses = [f"the master's ranks use {self.iface} ({self.host})"] + [
            f"{name} uses {info.get('iface')} ({' '.join(info.get('iface_addrs') or []) or '?'})"
            for name, info in sorted(self._joined().items(), key=lambda kv: self.rank_of[kv[0]])]
        return (
            "Across machines this usually means a rank advertised an address that the others "
            f"cannot reach: {'; '.join(uses)}. Make GLOO_SOCKET_IFNAME (`ppkit worker --iface`) name "
            "the interface that reaches the other machines; `ppkit doctor --master "
            f"{self.host}:{self.port}` on each machine shows which one that is.")

    def _ssh_tail(self, names) -> str:
        from ppkit.cluster import ssh

        tails = [ssh.log_tail(self._ssh_procs[n]) for n in names if n in self._ssh_procs]
        return "".join(f"\nssh said:\n{t}" for t in tails if t)

    def _start_ssh(self, missing: list[str]) -> None:
        from ppkit.cluster import ssh

        for name in missing:
            target = self.ssh_hosts.get(name)
            proc = self._ssh_procs.get(name)
            if target is None or (proc is not None and proc.poll() is None):
                continue
            self._ssh_procs[name] = ssh.start_worker(
                target, f"{self.host}:{self.port}", name, self.key)

    def stop_ranks(self) -> None:
        """Ask every agent to kill its rank (the controller cannot signal another machine's pids)."""
        with self._lock:
            for conn, _ in self.agents.values():
                self._send(conn, ("kill",))

    def close(self) -> None:
        from ppkit.cluster import ssh

        with self._lock:
            agents = list(self.agents.values())
            self.agents.clear()
            self._spawning = False
        for conn, _ in agents:
            self._send(conn, ("shutdown", "the master closed the cluster"))
            _wake_reader(conn)  # its reader thread closes it (closing it here too would race)
        for proc in self._ssh_procs.values():
            ssh.stop(proc)
        self._store = None


def _wake_reader(conn) -> None:
    """Make a thread blocked in ``conn.recv()`` return (EOF) without closing its descriptor."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def listen_error(exc: OSError, host: str, port: int) -> LaunchError:
    why = ("another program (or another cluster) already listens on that port"
           if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc))
    return LaunchError(
        f"cannot listen on {host}:{port}: {why}. Pick another port (listen='{host}:PORT'), or close "
        "the other cluster first.")


def handle_probe(conn) -> None:
    """Answer ``ppkit doctor``'s probe: this master's versions and host, then hang up."""
    try:
        conn.send(("probe", {**worker.versions(), "host": socket.gethostname()}))
    except OSError:
        pass
    conn.close()
