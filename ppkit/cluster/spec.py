"""Every option of ``ppkit.start`` / ``Cluster`` checked once, into one frozen ``ClusterSpec``.

A second ``ppkit.start(...)`` replaces the learner's working cluster: if its arguments were checked
only once the old cluster is closed, a typo would cost the work of the cells before it. So
``session.start`` builds the spec first, then closes the old cluster, then starts from the spec;
nothing checks the same option twice. The spec reads no running state and starts nothing
(generic checks live in ppkit/checks.py, network addresses in admission.py).

Which launcher starts the workers is one field, ``launcher`` (launchers/__init__.py keeps the
registry): "local" (a fork server on this machine), "spawn" (fresh interpreters), "remote"
(agents on other machines, ``listen=``) or "slurm" (tasks of a SLURM job). The older spellings
keep working: ``start_method="forkserver"|"spawn"`` and ``listen=...`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppkit.checks import check_env, check_labels, positive
from ppkit.cluster import start_methods, worker_setup
from ppkit.cluster.admission import master_interface, parse_key, parse_listen, remote_names
from ppkit.cluster.isolation import check_isolation
from ppkit.cluster.slurm.options import SlurmOptions, allocation_nodes, check_slurm_options
from ppkit.errors import ConfigError

LAUNCHERS = ("local", "spawn", "remote", "slurm")
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ClusterSpec:
    """A checked description of a cluster: what ``Cluster`` and its launcher are built from."""
    world_size: int
    launcher: str = "local"
    backend: str = "auto"  # "auto" is resolved by the Cluster, once (it counts GPUs: imports torch)
    timeout: float = DEFAULT_TIMEOUT_S
    start_timeout: float = DEFAULT_START_TIMEOUT_S
    process_group: bool = True
    env: tuple[tuple[str, str], ...] = ()
    labels: tuple[str, ...] | None = None
    listen: tuple[str, int] | None = None  # where the control channel listens for other machines
    remote: tuple[str, ...] = ()  # names of the remote workers, in rank order
    ssh_hosts: tuple[tuple[str, str], ...] = ()  # name -> ssh target, for remote workers ppkit starts
    key: bytes | None = field(default=None, repr=False)  # None: a new random key per cluster
    slurm: SlurmOptions | None = None
    isolation: str = "auto"  # a private network for the workers: "auto", "netns" or "off" (isolation.py)

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def _check_slurm(launcher: str, nodes, partition, time, sbatch_args, world_size: int) -> SlurmOptions | None:
    given = [n for n, v in (("nodes", nodes), ("partition", partition), ("time", time)) if v is not None]
    if sbatch_args:
        given.append("sbatch_args")
    if launcher != "slurm":
        if given:
            raise ConfigError(
                f"{', '.join(n + '=' for n in given)} only apply to launcher='slurm' (ranks on a SLURM "
                f"cluster's nodes); this cluster uses launcher={launcher!r}. Add launcher='slurm' or drop them.")
        return None
    return check_slurm_options(allocation_nodes(nodes, world_size), partition, time, sbatch_args)


def _launcher_name(launcher, start_method, listen) -> str:
    """The launcher these options ask for, from ``launcher`` or the older spellings."""
    if launcher is not None and launcher not in LAUNCHERS:
        raise ConfigError(
            f"unknown launcher {launcher!r}; the choices are {', '.join(map(repr, LAUNCHERS))}: 'local' "
            "forks workers on this machine, 'spawn' starts fresh interpreters here, 'remote' waits for "
            "workers on other machines (with listen=), 'slurm' runs them as tasks of a SLURM job.")
    method = start_methods.check_start_method(start_method)
    if launcher is None:
        if listen is not None:
            launcher = "remote"
        else:
            launcher = "spawn" if start_methods.resolve_start_method(method) == "spawn" else "local"
    if launcher == "spawn" and method == "forkserver" or launcher == "local" and method == "spawn":
        raise ConfigError(f"launcher={launcher!r} and start_method={method!r} contradict each other; "
                          "pass only launcher= ('local' forks from a fork server, 'spawn' starts fresh "
                          "interpreters).")
    # remote: the master's own ranks come from a fork server here; slurm forks on the nodes only
    if launcher == "remote" and start_methods.resolve_start_method(method) == "spawn" or launcher == "slurm" \
            and method == "spawn":
        raise ConfigError(
            f"a cluster across machines (launcher={launcher!r}) forks its workers on every machine, so it "
            "needs start_method='forkserver' (Linux); the spawn start method serves this machine only. "
            f"Pass start_method='forkserver' or unset {start_methods.START_METHOD_ENV}.")
    if launcher == "remote" and listen is None:
        raise ConfigError("launcher='remote' waits for workers on other machines, which need to know where: "
                          "pass listen='ADDR:PORT' too (e.g. listen='10.0.0.1:29600').")
    if launcher in ("local", "spawn") and listen is not None:
        raise ConfigError(f"listen= is for workers on other machines; launcher={launcher!r} keeps every rank "
                          "on this machine. Drop listen= or use launcher='remote'.")
    return launcher


def _backend_across_machines(launcher: str, backend: str) -> str:
    """The one place that decides: ranks on other machines (remote, slurm) use gloo, since the other
    machines' GPUs are unknown here; 'auto' means gloo there, and nccl is refused."""
    if launcher not in ("remote", "slurm"):
        return backend
    if backend not in ("auto", "gloo"):
        raise ConfigError(
            f"remote workers use the gloo backend (CPU tensors between machines), not {backend!r}. "
            f"Pass backend='gloo' or 'auto' with launcher={launcher!r}.")
    return "gloo"


def _check_network(launcher: str, listen, remote, key):
    """``listen``/``remote``/``key`` together: the last two mean nothing without the first."""
    if listen is None and launcher != "slurm":
        given = [n for n, v in (("remote", remote), ("key", key)) if v is not None]
        if given:
            raise ConfigError(
                f"{'= and '.join(given)}= only {'apply' if len(given) > 1 else 'applies'} to workers on "
                f"other machines, which need "
                f"listen='ADDR:PORT' too (e.g. listen='10.0.0.1:29600', remote=['worker1']). Without "
                f"listen every rank runs on this machine: drop {' and '.join(n + '=' for n in given)}.")
        return None
    if launcher == "slurm" and remote is not None:
        raise ConfigError("remote= names workers you start by hand; with launcher='slurm' SLURM starts every "
                          "rank (rank = SLURM_PROCID). Drop remote=.")
    if listen is None:
        return None
    host, port = parse_listen(listen)
    master_interface(host)
    return host, port


def cluster_spec(world_size, backend: str = "auto", *, timeout: float = DEFAULT_TIMEOUT_S,
                 start_timeout: float = DEFAULT_START_TIMEOUT_S, process_group: bool = True,
                 env: dict[str, str] | None = None, labels: list[str] | None = None,
                 listen: str | None = None, remote=None, key: bytes | str | None = None,
                 start_method: str = "auto", launcher: str | None = None, nodes: int | None = None,
                 partition: str | None = None, time: str | None = None, sbatch_args=(),
                 isolation: str = "auto") -> ClusterSpec:
    """Check every option of a cluster and return them as a ``ClusterSpec`` (``ConfigError`` otherwise)."""
    world_size = worker_setup.check_world_size(world_size)
    name = _launcher_name(launcher, start_method, listen)
    if not isinstance(backend, str) or backend not in worker_setup.BACKENDS:
        worker_setup.resolve_backend(backend, world_size)  # raises its own message
    if backend == "nccl" and name in ("local", "spawn"):
        worker_setup.resolve_backend(backend, world_size)  # counts this machine's GPUs
    timeout = positive(timeout, "timeout")
    start_timeout = positive(start_timeout, "start_timeout")
    if not isinstance(process_group, bool):
        raise ConfigError(f"process_group must be True (the ranks join a torch.distributed process "
                          f"group) or False (they do not), got {process_group!r}.")
    env = check_env(env) or {}
    labels = check_labels(labels, world_size)
    address = _check_network(name, listen, remote, key)
    backend = _backend_across_machines(name, backend)
    names, ssh_hosts = (), ()
    if name == "remote":
        names = tuple(remote_names(world_size, remote))
        ssh_hosts = tuple((n, h) for n, h in remote.items() if h) if isinstance(remote, dict) else ()
    slurm = _check_slurm(name, nodes, partition, time, tuple(sbatch_args) if sbatch_args else (), world_size)
    if slurm is not None and slurm.nodes > world_size:
        raise ConfigError(f"nodes={slurm.nodes} is more than the {world_size} rank(s) asked for: each node runs "
                          f"at least one rank. Ask for nodes <= {world_size}, or more ranks.")
    isolation = check_isolation(isolation, name)
    return ClusterSpec(
        world_size=world_size, launcher=name, backend=backend, timeout=timeout, start_timeout=start_timeout,
        process_group=process_group, env=tuple(env.items()), labels=tuple(labels) if labels else None,
        listen=address, remote=names, ssh_hosts=ssh_hosts,
        key=parse_key(key) if name in ("remote", "slurm") else None, slurm=slurm,
        isolation=isolation)
