"""One all_reduce to check that a world spanning machines works, under ppkit, torchrun or srun.

    ppkit master --listen 10.0.0.1:29600                      # ppkit: runs ``check`` on every rank
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr 10.0.0.1 \\
        -m ppkit.cluster.tools.allreduce_check                      # the same check under torchrun
    srun -N 2 -n 2 python -m ppkit.cluster.tools.allreduce_check    # ... or SLURM (set MASTER_PORT)

Every rank contributes ``rank + 1``; with ``world_size`` ranks the sum is n(n+1)/2 everywhere.
Each rank prints one JSON line: where it runs, what the launcher told it, and the sum it got.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def expected_sum(world_size: int) -> float:
    return world_size * (world_size + 1) / 2


def check(rank: int, world_size: int) -> dict:
    """Runs on every rank of an initialised process group: all_reduce(SUM) of rank + 1."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return {"rank": rank, "world_size": world_size, "host": socket.gethostname(), "pid": os.getpid(),
            "iface": os.environ.get("GLOO_SOCKET_IFNAME", "(hostname)"), "sum": value.item()}


def main() -> int:
    """Under a launcher: join its process group, run ``check``, print one JSON line."""
    import torch.distributed as dist

    from ppkit.cluster.tools.env import read_launch_env
    from ppkit.errors import ConfigError

    try:
        launch = read_launch_env()
    except ConfigError as exc:
        print(f"ppkit: {exc}", file=sys.stderr)
        return 2
    os.environ.update(launch.as_torchrun_env())  # SLURM's names -> the env:// names
    dist.init_process_group("gloo", rank=launch.rank, world_size=launch.world_size)
    try:
        row = check(launch.rank, launch.world_size)
    finally:
        dist.destroy_process_group()
    row.update(local_rank=launch.local_rank, source=launch.source,
               master=f"{launch.master_addr}:{launch.master_port}")
    print(json.dumps(row), flush=True)
    return 0 if row["sum"] == expected_sum(launch.world_size) else 1


if __name__ == "__main__":
    sys.exit(main())
