"""Seed 002's SLURM program, run as the seed runs it: ``srun -N 2 -n 4 python train.py``.

Every task that srun starts runs :func:`main`: it reads who it is with ``ppkit.read_launch_env()``
(SLURM_PROCID -> rank, SLURM_NTASKS -> world size, SLURM_LOCALID -> local rank, the first node of
SLURM_NODELIST -> MASTER_ADDR), joins a gloo process group there, trains a small model with DDP for
a few steps on its own shard of the data and prints one JSON line. :func:`run_srun` runs it on the
SLURM cluster this machine's commands reach and returns those lines, by rank.

    python -m ppkit.lessons.seed002          # under srun: one line per task
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from ppkit.errors import LaunchError

STEPS = 3


def main() -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.nn  # noqa: F401  -- before init_process_group: see the end of main()
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ppkit

    env = ppkit.read_launch_env()  # who am I (seed 002 reads os.environ['SLURM_PROCID'] & co. by hand)
    dist.init_process_group("gloo", init_method=env.init_method, rank=env.rank, world_size=env.world_size)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DDP(torch.nn.Linear(8, 1))  # on GPUs: DDP(model.cuda(env.local_rank), device_ids=[env.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(100 + env.rank)  # each rank its own shard of the data
    for _ in range(STEPS):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 1, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over every rank here
        optimizer.step()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(weights) for _ in range(env.world_size)]
    dist.all_gather(gathered, weights)
    record = {"rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank,
              "node": os.environ.get("SLURMD_NODENAME", socket.gethostname()), "master_addr": env.master_addr,
              "loss": round(loss.item(), 6), "same_weights_everywhere": all(torch.equal(g, weights) for g in gathered)}
    print(json.dumps(record), flush=True)
    # Leave together (barrier), DDP's reducer (which holds the group) gone, then the group: destroy_process_group()
    # frees it, which joins gloo's worker threads while Python still runs. That needs the import of
    # torch.distributed.nn above: DDP's constructor imports torch._dynamo, which imports
    # torch.distributed.nn.functional, whose functions take `group=group.WORLD` as a default -- evaluated at
    # import, so imported after init_process_group they pin the live group and destroy_process_group() cannot
    # free it. Its gloo threads then outlive Python: one still releasing the last all_gather's tensors when the
    # interpreter shuts down takes the GIL, is ended by Python (pthread_exit) inside a C++ destructor, and the
    # rank aborts after printing its line ("terminate called without an active exception").
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()
    return record


def run_srun(nodes: int = 2, ntasks: int = 4, timeout: float = 120, extra: tuple[str, ...] = ()) -> list[dict]:
    """``srun -N nodes -n ntasks python -m ppkit.lessons.seed002``; each task's record, by rank."""
    from ppkit.cluster.slurm.commands import require_tools, said
    from ppkit.lessons.data_parallel import free_port

    require_tools(("srun",))
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    env.pop("MASTER_ADDR", None)  # the first node's, as read_launch_env finds it
    command = ["srun", f"--nodes={nodes}", f"--ntasks={ntasks}", *extra, sys.executable, "-m", __name__]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"`{' '.join(command[:3])} ...` did not finish within {timeout:g} s; `squeue` shows "
                          "whether the step is still waiting for nodes.") from exc
    if proc.returncode != 0:
        raise LaunchError(f"`{' '.join(command)}` failed: {said(proc)}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return sorted(records, key=lambda r: r["rank"])


if __name__ == "__main__":
    main()
