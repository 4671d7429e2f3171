"""The environment torchrun gives each worker, built without torchrun's agent.

Compared with a real ``python -m torch.distributed.run`` on the same script by
tests/test_torchrun.py: the same keys, but for those in ``LEFT_OUT``.
"""

from __future__ import annotations

import os

# Set by torchrun for its workers but not here, and why.
LEFT_OUT = {
    "TORCHELASTIC_ERROR_FILE": "torchrun's agent reads a failed worker's error from that file; here the "
                               "traceback reaches the cell directly, and @record writes no file without it",
}
# Set here but not by torchrun: ppkit's local launcher sets them on every worker (launchers/base.py).
ADDED = {
    "PPKIT_*": "the worker's way back to the kernel, and the mark by which ppkit finds its processes",
    "PYTHONPATH": "ppkit's folder first, so a worker imports the same ppkit as the kernel",
    "PYTHONUNBUFFERED": "each rank's output reaches the cell as it is printed",
    "OMP_WAIT_POLICY": "PASSIVE: more ranks than cores, and spinning OpenMP threads stole their partners' cores",
    "GLOO_SOCKET_IFNAME": "gloo on the interface that reaches the master (loopback on one machine)",
    "TP_SOCKET_IFNAME": "the same for RPC's TensorPipe",
}
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's default --signals-to-handle


def common(nproc: int, master_addr: str, master_port: int, run_id: str, role: str = "default",
           environ: dict | None = None, nnodes: int = 1, restart_count: int = 0,
           max_restarts: int = 0) -> dict[str, str]:
    """What every rank of one run sees (``rank_env`` adds the rank's own); ``nproc`` ranks on each
    of ``nnodes`` nodes; ``restart_count``: which attempt of ``--max-restarts`` this is (restarts.py)."""
    environ = os.environ if environ is None else environ
    world = str(nproc * nnodes)
    env = {
        "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": world,
        "GROUP_WORLD_SIZE": str(nnodes), "ROLE_NAME": role,
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count), "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,  # the same for every attempt, as torchrun's
        # torchrun's agent hosts the store and its workers join it; here rank 0 hosts it before the
        # script starts (rank.host_store), and every rank joins it the same way
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": SIGNALS,
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if nproc > 1 and "OMP_NUM_THREADS" not in environ:  # torchrun's default for more than one process
        env["OMP_NUM_THREADS"] = "1"
    return env


def rank_env(rank: int, local_rank: int | None = None, group_rank: int = 0) -> dict[str, str]:
    """One process's own variables. On one node its rank, local rank and role rank are the same; on
    several, ``local_rank`` is its place on its node and ``group_rank`` the node's (torchrun's node rank)."""
    local_rank = rank if local_rank is None else local_rank
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "ROLE_RANK": str(rank), "GROUP_RANK": str(group_rank)}
