"""The options of ``ppkit.start_rpc`` / ``RpcWorld``, checked before anything runs or stops.

An RPC world is a cluster (spec.py checks its options: where the workers run, the network, the
env) plus RPC's own options, checked here. Nothing here reads running state or starts anything;
world.py checks the kernel's own RPC state.
"""

from __future__ import annotations

from ppkit.checks import positive
from ppkit.cluster.admission import rpc_remote_names
from ppkit.cluster.spec import ClusterSpec, cluster_spec
from ppkit.errors import ConfigError


def rpc_worker_names(num_workers: int) -> list[str]:
    return [f"worker{i}" for i in range(1, num_workers + 1)]


def check_rpc(num_workers, *, num_worker_threads: int = 16, rpc_timeout: float = 60.0,
              start_timeout: float = 120.0, env: dict[str, str] | None = None, listen: str | None = None,
              remote=None, key=None, start_method: str = "auto", launcher: str | None = None,
              nodes: int | None = None, partition: str | None = None, time: str | None = None,
              sbatch_args=()) -> ClusterSpec:
    """Refuse anything ``RpcWorld(num_workers, **options)`` would refuse but the kernel's own RPC
    state; the spec of the world's cluster of workers (ranks 0.. = "worker1"..)."""
    if isinstance(num_worker_threads, bool) or not isinstance(num_worker_threads, int) or num_worker_threads < 1:
        raise ConfigError(f"num_worker_threads must be a positive whole number (e.g. 16), got "
                          f"{num_worker_threads!r}.")
    positive(rpc_timeout, "rpc_timeout")
    start_timeout = positive(start_timeout, "start_timeout")
    probe = cluster_spec(num_workers, "gloo", start_timeout=start_timeout, env=env, listen=listen,
                         key=key, start_method=start_method, launcher=launcher, nodes=nodes,
                         partition=partition, time=time, sbatch_args=sbatch_args,
                         remote=num_workers if remote is None and listen is not None else remote)
    names = rpc_worker_names(probe.world_size)
    if probe.launcher == "remote":  # the remote workers are the last ones, named by rank
        remote = rpc_remote_names(names, remote)
    return cluster_spec(probe.world_size, "gloo", process_group=False, timeout=start_timeout,
                        start_timeout=start_timeout, env=env, labels=names, listen=listen,
                        remote=remote if probe.launcher == "remote" else None, key=probe.key,
                        launcher=probe.launcher, nodes=nodes, partition=partition, time=time,
                        sbatch_args=sbatch_args, isolation="off")  # the kernel is a rank (isolation.py)
