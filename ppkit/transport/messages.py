"""Every message on the control channel, one small frozen dataclass per kind.

Who talks to whom (each arrow is one authenticated channel connection, see channel.py):

    worker      -> controller   Hello, then Ready or JoinFailed; afterwards Output, Result,
                                Cancelled, Stacks, FlightRecord (forked, or a fresh interpreter: fresh.py)
    controller  -> worker       Init or Reject (the answer to Hello); then Run, AskStacks, Cancel, Shutdown,
                                AskFlightRecord (flight_messages.py); both ways, pdb on a rank (debug/messages.py)
    fork server -> controller   ForkServerHello, then Spawned and Exited for each worker it forks
    controller  -> fork server  Spawn, Kill, Shutdown
    agent       -> controller   AgentHello, then Spawned and Exited (as a fork server does);
                                Heartbeat every 2 s from admission on
    controller  -> agent        Heartbeat every 2 s from the AgentHello on (if the ppkit versions
                                match); Admitted or Reject (the answer to AgentHello); then Spawn,
                                Kill, Shutdown
    doctor      -> controller   Probe; the controller answers ProbeReply and hangs up

Liveness: only the controller <-> agent connection crosses machines with nothing else to notice a dead
peer (power lost, a SIGSTOPped process, a pulled cable close no connection). Both ends send Heartbeat
every HEARTBEAT_EVERY_S (2 s) and give the other up after SILENT_AFTER_S (12 s) of silence (heartbeat.py).
Workers need none: a remote rank dies with its agent (PR_SET_PDEATHSIG), a local one with the kernel.

The first message on a connection says what the peer is. Both ends run the same ppkit (admission
checks the versions), so the classes pickle by reference. Fields hold plain data only, never
objects that need torch to unpickle: the controller must be able to read a hello without
importing torch. A field is a str, int, float, bool, bytes or None, another frozen dataclass of
this module (what a message carries: ``Versions``, ``JoinConfig``, ``ErrorInfo``, ...), a
``tuple[X, ...]`` of those (a sequence of like items, never a record read by position), or
``dict[str, str]`` where the keys are data rather than field names (an environment).
tests/test_layout.py holds every message to this.
"""

from __future__ import annotations

from dataclasses import dataclass, field


# -- what the messages carry ------------------------------------------------------------------
@dataclass(frozen=True)
class Versions:
    """What must agree across machines (admission.version_problem): Python, torch, ppkit."""
    python: str
    torch: str
    ppkit: str


@dataclass(frozen=True)
class WorkerHello:
    """Who a worker is: its rank (None: the controller did not say), the name of its agent, if
    any, its pid and host, and its versions."""
    rank: int | None
    name: str | None
    pid: int
    host: str
    versions: Versions


@dataclass(frozen=True)
class FileStoreAt:
    """A ``FileStore`` at ``path`` (ranks that share this machine's file system)."""
    path: str


@dataclass(frozen=True)
class TcpStoreAt:
    """A ``TCPStore`` the controller serves at ``host:port`` (ranks on other machines)."""
    host: str
    port: int


@dataclass(frozen=True)
class JoinConfig:
    """How a worker joins: its rank, the world, the store of the rendezvous, the environment,
    working directory and ``sys.path`` it takes on, its device and torch threads (None: torch's
    default), and the timeouts (seconds) of the rendezvous and of the process group."""
    rank: int
    world_size: int
    backend: str = "gloo"
    process_group: bool = True
    store: FileStoreAt | TcpStoreAt | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    sys_path: tuple[str, ...] = ()
    device: str = "cpu"
    threads: int | None = None
    join_timeout: float = 60.0
    pg_timeout: float = 1800.0
    capture_output: bool = True


@dataclass(frozen=True)
class WorkerInfo:
    """A rank that joined: what ``Cluster.workers`` shows (as a dict) for it."""
    rank: int
    pid: int
    host: str
    backend: str
    device: str


@dataclass(frozen=True)
class Rendezvous:
    """One ``env://`` or ``tcp://`` rendezvous a process made (rendezvous.py)."""
    scheme: str
    host: str
    port: int


@dataclass(frozen=True)
class ErrorInfo:
    """An exception on a rank: its type's name, message and formatted traceback, and the
    rendezvous its process made (for diagnostics.reinit_note)."""
    type: str
    message: str
    traceback: str
    rendezvous: tuple[Rendezvous, ...] = ()


@dataclass(frozen=True)
class CellSource:
    """A notebook cell's code, so that a rank's traceback can show its lines (``linecache``)."""
    filename: str
    text: str


@dataclass(frozen=True)
class AgentInfo:
    """Who a remote agent is: its name, host, pid and versions, the interface gloo and
    TensorPipe use there and its addresses, the address that reached the master, and the ranks
    its launcher placed on it (SLURM: a node's; empty: the master decides)."""
    name: str
    host: str
    pid: int
    versions: Versions
    iface: str | None
    iface_addrs: tuple[str, ...]
    local_address: str
    ranks: tuple[int, ...] = ()


# -- a worker's life ------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    """A worker's first message: who it is."""
    info: WorkerHello


@dataclass(frozen=True)
class Init:
    """The controller's answer to ``Hello``: how to join (rank, world size, store, env, ...)."""
    config: JoinConfig


@dataclass(frozen=True)
class Reject:
    """The controller refuses a worker or an agent; ``reason`` says why and what to do."""
    reason: str


@dataclass(frozen=True)
class Ready:
    """The worker joined its process group; ``info`` is what ``Cluster.workers`` shows."""
    info: WorkerInfo


@dataclass(frozen=True)
class JoinFailed:
    """The worker could not join its process group; ``error`` says why."""
    error: ErrorInfo


@dataclass(frozen=True)
class Output:
    """Text the rank wrote to ``stream`` ("stdout" or "stderr")."""
    stream: str
    text: str


# -- jobs -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """Run a job: ``payload`` is cloudpickled ``(fn, args, kwargs)``; ``sources``: notebook cells
    the worker has not had yet."""
    job_id: int
    payload: bytes
    sources: tuple[CellSource, ...] = ()
    last: bool = False  # the process ends with the job, through the interpreter's own exit (ppkit.spawn, torchrun)


@dataclass(frozen=True)
class Result:
    """A job ended: ``ok`` with ``value`` the cloudpickled return value, or not ``ok`` with
    ``value`` the exception."""
    job_id: int
    ok: bool
    value: bytes | ErrorInfo


@dataclass(frozen=True)
class Cancel:
    """Stop job ``job_id`` (Kernel > Interrupt in the notebook)."""
    job_id: int


@dataclass(frozen=True)
class Cancelled:
    """Job ``job_id`` stopped because it was cancelled."""
    job_id: int


@dataclass(frozen=True)
class AskStacks:
    """Where is your main thread now? (asked when a job times out or a rank waits)."""


@dataclass(frozen=True)
class Stacks:
    """The main thread's stack while running ``job_id`` (None: between jobs); ``rendezvous``:
    each env:// or tcp:// rendezvous the process made (rendezvous.py)."""
    job_id: int | None
    text: str
    rendezvous: tuple[Rendezvous, ...] = ()


@dataclass(frozen=True)
class Shutdown:
    """Exit now (workers, fork server, agents); ``reason`` is for an agent to print. ``park_s`` > 0, to a fork
    server: leave this controller and wait that long for the next (ppkit/cluster/launchers/spare.py)."""
    reason: str = ""
    park_s: float = 0.0


# -- starting workers: the fork server and remote agents ---------------------------------------
@dataclass(frozen=True)
class ForkServerHello:
    """The fork server's first message; ``isolation``: "" when it and its workers run in a private
    network (private_net.py), else why not (not asked for, or what the machine refused)."""
    pid: int
    isolation: str = "not asked for"


@dataclass(frozen=True)
class AgentHello:
    """A remote agent's first message: who it is."""
    info: AgentInfo


@dataclass(frozen=True)
class Admitted:
    """The controller's answer to an admitted agent: its (first) rank, the world size and the
    master's address ("ADDR:PORT")."""
    rank: int
    world_size: int
    master: str


@dataclass(frozen=True)
class Spawn:
    """Fork one worker per rank in ``ranks`` (an agent first stops the ones it has)."""
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Kill:
    """Stop the workers you forked (only ``ranks``' where given: the fork server), and stay. Their parent
    stops them: only it knows which of its pids it has not reaped yet."""
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Spawned:
    """Rank ``rank`` runs as process ``pid`` (a pid of the machine that sends this)."""
    rank: int
    pid: int


@dataclass(frozen=True)
class Exited:
    """Process ``pid`` (rank ``rank``, None if unknown) ended with wait status ``status``."""
    rank: int | None
    pid: int
    status: int


@dataclass(frozen=True)
class Heartbeat:
    """I am still here (controller <-> agent, both ways, every 2 s; needs no answer)."""


# -- ppkit doctor -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """``ppkit doctor`` asks a master for its versions."""


@dataclass(frozen=True)
class ProbeReply:
    """The master's host and versions."""
    host: str
    versions: Versions
