"""``%%torchrun --nnodes N``: the ranks on N nodes of a SLURM cluster, through the SLURM launcher.

Each run starts a cluster of its own, ``nproc_per_node`` ranks on each of N nodes: a batch job from
outside an allocation (sbatch), a step of the allocation from inside one (as srun), and ends it when
the run ends, so every run has fresh processes, as under torchrun. First each rank says where SLURM
put it (its node, SLURM_NODEID, and its place there, SLURM_LOCALID), and rank 0 hosts the rendezvous
store on its node's address, on a free port or ``--master-port``, as torchrun's agent on node 0 does;
then every rank runs the script with torchrun's variables for several nodes (GROUP_RANK the node's,
LOCAL_RANK the place on it, MASTER_ADDR and MASTER_PORT rank 0's store).
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace

from ppkit.cluster.slurm import commands
from ppkit.cluster.spawn import call as spawn_call
from ppkit.cluster.spawn import explain
from ppkit.cluster.torchrun import environ, rank
from ppkit.errors import ConfigError, JobInterrupted, LaunchError, WorkerError

PLACE_TIMEOUT_S = 120.0  # what saying where each rank is may take, store included
DEFAULT_ADDR = "127.0.0.1"  # torchrun's --master-addr default: here, rank 0's node's address instead


def run(launch, args: tuple, caller: explain.Caller, shown: tuple | None):
    """``rank.run_as_rank`` on ``launch.nnodes`` SLURM nodes; ``args``: its ``(cwd, path0, argv, target)``."""
    __tracebackhide__ = True  # noqa: F841 - read by IPython's traceback
    require_slurm(launch, caller)
    cluster = start(launch)
    try:
        placed = place(cluster, launch, caller)
        env, own = environment(launch, placed)
        # ${hostname}: each rank's socket.gethostname(), as torch's agent writes its own (local_elastic_agent.py)
        output = launch.output.on_hosts({r: worker["host"] for r, worker in cluster.workers.items()})
        return spawn_call.run_on(cluster, rank.run_as_rank, (env, *args, own), launch.timeout, caller, shown,
                                 output=output, profile=launch.profile)
    finally:
        cluster.close()  # the job (or step) ends with it


def require_slurm(launch, caller: explain.Caller, environ=os.environ) -> None:
    """SLURM's commands on PATH, and inside an allocation as many nodes as asked for."""
    asked = f"nnodes={launch.nnodes}" if caller.name == "ppkit.torchrun" else f"--nnodes {launch.nnodes}"
    missing = commands.missing_tools()
    if missing:
        raise ConfigError(
            f"{asked} runs the ranks on {launch.nnodes} nodes of a SLURM cluster, and SLURM's commands "
            f"({', '.join(missing)}) are not on PATH here. Run the notebook on the cluster's login node or inside "
            "an allocation (try `module load slurm` there), or leave nnodes out to run every rank on this machine.")
    job, have = commands.inside_allocation(environ), environ.get("SLURM_JOB_NUM_NODES", "")
    if job and have.isdigit() and launch.nnodes > int(have):
        raise ConfigError(
            f"{asked} is more than the {have} node(s) of your allocation {job}: this notebook runs inside it "
            f"(SLURM_JOB_ID={job}), so the ranks are a step of it and cannot leave it. Ask for {have} node(s) or "
            f"fewer, or start the notebook in an allocation of {launch.nnodes} nodes (salloc -N {launch.nnodes}).")


def start(launch):
    """A cluster of ``nproc_per_node`` ranks on each node, without a process group: the script makes its own."""
    from ppkit.cluster.controller import Cluster
    from ppkit.cluster.spec import cluster_spec

    spec = cluster_spec(launch.nnodes * launch.nproc_per_node, "gloo", process_group=False, launcher="slurm",
                        nodes=launch.nnodes)
    return Cluster.from_spec(replace(spec, slurm=replace(spec.slurm, ntasks_per_node=launch.nproc_per_node)))


def place(cluster, launch, caller: explain.Caller) -> list[tuple]:
    """Each rank's ``(node, local rank, node name, store)``; rank 0's store is ``(address, port)``, or
    why it could not host one."""
    __tracebackhide__ = True  # noqa: F841
    addr = None if launch.master_addr == DEFAULT_ADDR else launch.master_addr
    pids = {r: worker.get("pid") for r, worker in cluster.workers.items()}
    try:
        placed = cluster.run(where, addr, launch.master_port or 0, timeout=PLACE_TIMEOUT_S)
    except (WorkerError, JobInterrupted) as exc:
        cluster.stop_workers(f"{caller.name} stops its processes when a call ends.")
        raise explain.translate(exc, pids, cluster.world_size, PLACE_TIMEOUT_S, caller) from None
    store = placed[0][3]
    if isinstance(store, str):
        raise ConfigError(store)
    return placed


def where(rank_: int, world_size: int, addr: str | None, port: int) -> tuple:
    """On each rank, before the script: where SLURM put it; rank 0 hosts the store there."""
    node, local = int(os.environ["SLURM_NODEID"]), int(os.environ["SLURM_LOCALID"])
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if rank_ != 0:
        return node, local, name, None
    from ppkit.cluster.slurm import hosts

    # the launcher's MASTER_ADDR is the job's first node, where rank 0 runs (as under srun)
    addr = addr or os.environ.get("MASTER_ADDR") or hosts.node_address(name)
    try:
        return node, local, name, (addr, rank.host_store_first(addr, port, world_size))
    except OSError as exc:
        taken = "another program holds that port; leave --master-port out for a free one, or give another. " \
            if port else ""
        return node, local, name, (f"rank 0 cannot host the rendezvous store on {addr}:{port} on node {name}: "
                                   f"{exc.strerror}. {taken}With --master-addr, name an address of the first node "
                                   "of the job (or leave it out: that node's address is found for you).")


def environment(launch, placed: list[tuple]) -> tuple[dict, list[dict]]:
    """torchrun's variables for every rank (``environ.common``) and each rank's own, from where it runs."""
    nproc = launch.nproc_per_node
    firsts = [placed[g * nproc][2] for g in range(launch.nnodes)]  # the name of each node's first rank's host
    for rank_, (node, local, name, _) in enumerate(placed):
        # torchrun numbers ranks node by node, nproc on each node, each node a machine of its own
        if (node, local, name) != (rank_ // nproc, rank_ % nproc, firsts[rank_ // nproc]) \
                or len(set(firsts)) < launch.nnodes:
            by_node: dict[str, list[int]] = {}
            for r, (n, _, host, _) in enumerate(placed):
                by_node.setdefault(f"node {n} ({host})", []).append(r)
            raise LaunchError(
                f"SLURM placed the ranks as {by_node}, not {nproc} on each node in order as torchrun's "
                f"--nproc-per-node {nproc} does (rank {rank_} is local rank {local} of node {node}, on {name}). "
                "The job was ended. Check that each node has the CPUs for it (`sinfo -N -l`).")
    addr, port = placed[0][3]
    env = environ.common(nproc, addr, port, launch.run_id, launch.role, nnodes=launch.nnodes)
    return env, [environ.rank_env(r, local, node) for r, (node, local, _, _) in enumerate(placed)]
