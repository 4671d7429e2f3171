"""A learner's kernel, reduced to what matters for isolation tests: ``python tests/learner.py MODE``.

MODE is ``cluster`` (``ppkit.Cluster(2, "gloo")`` after an all_reduce), ``rpc`` (``ppkit.start_rpc(2)``
after an ``rpc_sync``) or ``spawn`` (``ppkit.spawn`` of the DDP tutorial's set-up: env:// on a fixed
MASTER_PORT, an all_reduce, then the processes wait). Once everything listens it prints one JSON
line (``{"ready": ..., "isolation": ...}``), waits for a line on stdin, then closes all and exits
0. Any failure: a traceback and exit code 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ppkit
from ppkit.cluster.spawn import call as spawn_call


def _all_reduce(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    return t.item()


def ddp_like(rank, world_size, folder):
    """The DDP tutorial's setup(), an all_reduce, then a wait (for the probe) until ``go`` appears."""
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(1)
    dist.all_reduce(t)
    Path(folder, f"ready-{rank}").write_text(str(t.item()))
    while not Path(folder, "go").exists():
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()


def main(mode: str) -> None:
    home = Path(os.environ["HOME"])
    if mode == "cluster":
        cluster = ppkit.Cluster(2, "gloo", timeout=60)
        ready = cluster.run(_all_reduce)
        isolation = cluster.isolation
    elif mode == "rpc":
        from torch.distributed import rpc

        world = ppkit.start_rpc(2)
        ready = rpc.rpc_sync("worker1", os.getpid) != os.getpid()
        isolation = world.isolation
    elif mode == "spawn":
        context = ppkit.spawn(ddp_like, args=(2, str(home)), nprocs=2, join=False)
        while not all((home / f"ready-{r}").exists() for r in range(2)):
            if context.join(timeout=0.05):
                raise RuntimeError("the spawned processes ended before they were ready")
        ready = [float((home / f"ready-{r}").read_text()) for r in range(2)]
        isolation = spawn_call._kept[(2, "auto")].isolation
    else:
        raise SystemExit(f"unknown mode {mode!r}: cluster, rpc or spawn")
    print(json.dumps({"ready": ready, "isolation": str(isolation), "pid": os.getpid()}), flush=True)
    sys.stdin.readline()
    if mode == "cluster":
        cluster.close()
    elif mode == "rpc":
        world.close()
    else:
        (home / "go").write_text("")
        context.join(60)
        spawn_call.close()


if __name__ == "__main__":
    main(sys.argv[1])
