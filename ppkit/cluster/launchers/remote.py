"""The remote launcher: a Cluster that listens on a network address and admits workers by name.

``Cluster(2, listen="10.0.0.1:29600")`` keeps rank 0 on this machine and waits for ``worker1``
(rank 1), started on the other machine with ``ppkit worker --connect 10.0.0.1:29600 --name
worker1``. That command runs an *agent* (ppkit/transport/agent.py) which, once admitted, forks the
rank's worker process on request, so ``restart()`` works across machines too.

An agent is admitted before anything runs, or refused with a message on both machines (an
unexpected name, or admission.py's checks: versions, network interface). Ranks follow the order of
the names, not of connections. The rendezvous is a TCPStore the controller hosts on the listen address.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import replace

from ppkit.cluster import diagnostics, worker_setup
from ppkit.cluster.admission import (
    JoinedAgent,
    join_command,
    join_problem,
    master_interface,
    without_socket_vars,
)
from ppkit.cluster.inbox import Item, LaunchFailed
from ppkit.cluster.launchers.base import Process
from ppkit.cluster.launchers.local import ForkServerLauncher
from ppkit.transport import channel, heartbeat, ifaces, messages, worker


class RemoteLauncher(ForkServerLauncher):
    """The master's ranks from a local fork server, the others from admitted remote agents; the
    rendezvous is a TCPStore on the listen address."""

    name = "remote"

    def __init__(self, spec, inbox, key: bytes):
        super().__init__(spec, inbox, key)
        self.host, self.port = self.listen_address()
        self.names = self.worker_names()
        self.ssh_hosts = dict(spec.ssh_hosts)
        self.lay_out({name: (self.world_size - len(self.names) + i,) for i, name in enumerate(self.names)})
        self._start_timeout = spec.start_timeout
        self._lock = threading.RLock()  # guards self.agents and every send to an agent
        self._spawning = False
        self.agents: dict[str, JoinedAgent] = {}
        self._store = self._store_port = None
        self._rpc_store, self._key_shown = None, False  # see rendezvous_url; begin prints the key once
        self._ssh_procs: dict[str, object] = {}
        self.iface = master_interface(self.host)

    def listen_address(self) -> tuple[str, int]:  # (slurm.py chooses its own, and its names)
        return self.spec.listen

    def lay_out(self, ranks_of: dict[str, tuple[int, ...]]) -> None:
        """Which ranks each agent forks (one each here; slurm.py's agents fork a node's ranks)."""
        self.ranks_of, self.rank_of = ranks_of, {name: ranks[0] for name, ranks in ranks_of.items()}  # first: words
        self.name_of = {rank: name for name, ranks in ranks_of.items() for rank in ranks}
        self.local_ranks = [rank for rank in range(self.world_size) if rank not in self.name_of]

    def worker_names(self) -> list[str]:
        return list(self.spec.remote)

    # -- what the controller asks ---------------------------------------------------------------
    def local_env(self) -> dict[str, str]:
        """Environment of the master's own ranks: gloo on the listen address's interface."""
        return {**ifaces.socket_env(self.iface), "MASTER_ADDR": self.host}

    def server_address(self) -> tuple[str, int]:
        return self.host, self.port

    def bind(self, address: tuple[str, int], on_connect=None) -> None:
        super().bind(address, on_connect)
        self.port = address[1]  # the port the system chose for listen='ADDR:0'

    def join_command(self, name: str, full_key: bool = False) -> str:
        """What to type on the worker's machine; the key masked unless ``full_key``."""
        return join_command(self.key, f"{self.host}:{self.port}", name, full_key)

    def init_config(self, rank: int, config: messages.JoinConfig, generation: int) -> messages.JoinConfig:
        config = replace(config, store=messages.TcpStoreAt(self.host, self._store_port))
        if rank in self.name_of:
            # the worker's own machine decides its interface (ppkit worker --iface) and paths
            config = replace(config, env=without_socket_vars(config.env), cwd=None, sys_path=(), device="cpu",
                             threads=None)  # its machine's cores, not ours
        return config

    def rendezvous_url(self, name: str = "") -> str:
        """A ``tcp://`` init_method for rank 0 (this process): a store it holds on the listen address
        (worker_setup.tcp_store; not a port picked by bind-then-close, which another could take meanwhile)."""
        self._rpc_store = worker_setup.tcp_store(self.host, 1, self._start_timeout, multi_tenant=True)
        return f"tcp://{self.host}:{self._rpc_store.port}"

    def rank_label(self, rank: int, info: dict) -> str:
        name = self.name_of.get(rank)
        return f"{name} on {info.get('host', '?')}, pid {info.get('pid')}" if name else super().rank_label(rank, info)

    # -- admission (runs in the connection's reader thread) ----------------------------------
    def accept(self, conn, first) -> bool:
        if not isinstance(first, messages.AgentHello):
            return super().accept(conn, first)
        info = first.info
        name = info.name
        # heartbeats from now on (the checks below may import torch) to an agent that knows them
        pulse = heartbeat.Pulse(conn, self._lock, beating=info.versions.ppkit == worker.ppkit_version())
        problem = join_problem(info, self.host) if name in self.rank_of else None  # slow: outside the lock
        with self._lock:
            refusal, fatal = self._refusal(name, info) if problem is None else (problem, True)
            if refusal is None:
                self.agents[name] = JoinedAgent(conn, info)
                self._send(conn, messages.Admitted(self.rank_of[name], self.world_size, f"{self.host}:{self.port}"))
                if self._spawning:
                    self._spawn(name)
        if refusal is not None:
            self._send(conn, messages.Reject(refusal))
            pulse.close()
            if fatal:
                self.inbox.put(Item(name, LaunchFailed(self.rank_of[name], f"the master refused {name}: {refusal}")))
            return True
        self._serve_agent(name, conn, info, pulse)
        return True

    def _refusal(self, name: str, info: messages.AgentInfo) -> tuple[str | None, bool]:
        if name not in self.rank_of:
            why = (f"this cluster expects the worker(s) {', '.join(self.names)}, not {name!r}. "
                   f"Start the worker with --name {self.names[0]} (or another expected name).")
            return why, False
        if name in self.agents:
            other = self.agents[name].info
            why = (f"{name} has already joined from {other.host} (pid {other.pid}). "
                   "Stop that worker first, or give this one another expected name.")
            return why, False
        return None, False

    def _serve_agent(self, name: str, conn, info: messages.AgentInfo, pulse) -> None:
        silent = None  # or for how long it said nothing before we gave it up
        while True:
            try:
                msg = heartbeat.receive(conn)
            except (EOFError, OSError):
                break
            except heartbeat.PeerSilent as exc:
                silent = exc.seconds
                break
            if isinstance(msg, (messages.Spawned, messages.Exited)):  # the source, ``name``: whose machine's pids
                self.inbox.put(Item(name, msg))
        with self._lock:
            current = getattr(self.agents.get(name), "conn", None) is conn  # else dismissed on purpose (close, ...)
            if current:
                del self.agents[name]
        pulse.close()
        if current:
            self.inbox.put(Item(name, LaunchFailed(self.rank_of[name], self.agent_lost(name, info, silent))))

    def agent_lost(self, name: str, info: messages.AgentInfo, silent: float | None) -> str:
        return diagnostics.agent_lost(name, info.host, silent)

    # -- start, restart, close -----------------------------------------------------------------
    def begin(self, say=print) -> None:
        """A fresh store for this generation; ask every joined agent to fork its rank."""
        super().begin()
        self._new_store()
        with self._lock:
            self._spawning = True
            missing = [n for n in self.names if n not in self.agents]
            for name in self.agents:
                self._spawn(name)
        self.request(missing, say)

    def request(self, missing: list[str], say=print) -> None:
        """Have the agents that have not joined started: by ssh where a host is known, else by hand."""
        self._start_ssh(missing)
        hand = [n for n in missing if n not in self.ssh_hosts]
        if hand:  # the whole key once, where the other machine needs it; saved outputs keep it
            full, self._key_shown = not self._key_shown, True
            say(f"Waiting for {', '.join(hand)} to join {self.host}:{self.port}. On each worker's "
                "machine run:\n" + "\n".join(f"  {self.join_command(n, full)}" for n in hand), flush=True)

    def end_start(self) -> None:
        with self._lock:
            self._spawning = False

    def _spawn(self, name: str) -> None:
        self._send(self.agents[name].conn, messages.Spawn(self.ranks_of[name]))

    def _send(self, conn, msg) -> None:
        with self._lock, contextlib.suppress(OSError):  # a gone agent: its reader thread reports that
            conn.send(msg)

    def _joined(self) -> dict[str, messages.AgentInfo]:
        with self._lock:
            return {name: agent.info for name, agent in self.agents.items()}

    def _new_store(self) -> None:
        self._store = None  # the old one stops serving (it owns and closes its socket)
        self._store = worker_setup.tcp_store(self.host, self.world_size, self._start_timeout)
        self._store_port = self._store.port

    def describe_missing(self, ready: set[int]) -> str:
        """What a start still waits for, e.g. "worker1 (rank 1 of 2) to connect"."""
        parts = []
        local = [r for r in self.local_ranks if r not in ready]
        remote_missing = any(self.rank_of[n] not in ready for n in self.names)
        if local:  # started; joining the process group, they wait for every remote rank too
            parts.append(f"local rank(s) {local}" + (" (started, waiting in the process group for the remote "
                                                     "rank(s) below)" if remote_missing else ""))
        joined = self._joined()
        for name in self.names:
            rank = self.rank_of[name]
            if rank in ready:
                continue
            if name in joined:
                info = joined[name]
                parts.append(f"{name} (rank {rank} of {self.world_size}, on {info.host}, "
                             f"interface {info.iface} {' '.join(info.iface_addrs)}) "
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
            f"{name} uses {info.iface} ({' '.join(info.iface_addrs) or '?'})"
            for name, info in sorted(self._joined().items(), key=lambda kv: self.rank_of[kv[0]])]
        return (
            "Across machines this usually means a rank advertised an address that the others "
            f"cannot reach: {'; '.join(uses)}. Make GLOO_SOCKET_IFNAME (`ppkit worker --iface`) name "
            "the interface that reaches the other machines; `ppkit doctor --master "
            f"{self.host}:{self.port}` on each machine shows which one that is.")

    def _ssh_tail(self, names) -> str:
        from ppkit.cluster.launchers import ssh

        tails = [ssh.log_tail(self._ssh_procs[n]) for n in names if n in self._ssh_procs]
        return "".join(f"\nssh said:\n{t}" for t in tails if t)

    def _start_ssh(self, missing: list[str]) -> None:
        from ppkit.cluster.launchers import ssh

        for name in missing:
            proc = self._ssh_procs.get(name)
            if name in self.ssh_hosts and (proc is None or proc.poll() is not None):
                where = f"{self.host}:{self.port}"
                self._ssh_procs[name] = ssh.start_worker(self.ssh_hosts[name], where, name, self.key)

    def stop(self, workers: dict[int, dict]) -> None:
        """Ask every agent to kill its rank (the controller cannot signal another machine's pids)."""
        with self._lock:
            for agent in self.agents.values():
                self._send(agent.conn, messages.Kill())
        super().stop(workers)

    def processes(self) -> list[Process]:
        agents = [Process("agent", info.pid, self.rank_of.get(name), info.host)
                  for name, info in sorted(self._joined().items())]
        return super().processes() + agents

    def close(self) -> None:
        from ppkit.cluster.launchers import ssh

        super().close()
        with self._lock:
            agents = list(self.agents.values())
            self.agents.clear()
            self._spawning = False
        for agent in agents:
            self._send(agent.conn, messages.Shutdown("the master closed the cluster"))
            channel.wake_reader(agent.conn)  # its reader thread closes it (closing it here too would race)
        for proc in self._ssh_procs.values():
            ssh.stop(proc)
        self._store = self._rpc_store = None
