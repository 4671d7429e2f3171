"""The profiler's overhead: a DDP training step with ``profile=True`` against without (ppkit/profiling/).

    python benchmarks/bench_profile.py                 # 2 ranks, 30 steps per call, 4 rounds
    python benchmarks/bench_profile.py --steps 50 --rounds 6 --shapes

Each round makes two ``ppkit.spawn`` calls of the same function, one plain and one with ``profile=True``
(``--shapes``: ``profile=dict(record_shapes=True)``), in turns so that a machine that gets busier or quieter
affects both. Inside each call rank 0 times every step of a small DDP MLP (forward, backward with its
all-reduces, optimizer step); the kernel times the whole call (start of the processes, clock pings, the
ranks' traces sent back and merged). Prints the median step and call of each mode and their ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import ppkit
from ppkit.cluster.worker_setup import free_port


def train(rank: int, world_size: int, port: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(512, 512), torch.nn.ReLU())]
    model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 512)
    times = []
    for _ in range(steps + 2):  # the first two steps warm up (DDP's first step builds its buckets)
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(out, "w") as file:
            json.dump(times[2:], file)
    dist.destroy_process_group()


def one_call(profile, steps: int, nprocs: int) -> tuple[float, list[float]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        t0 = time.perf_counter()
        ppkit.spawn(train, args=(nprocs, free_port(), steps, out.name), nprocs=nprocs, profile=profile)
        call = time.perf_counter() - t0
        with open(out.name) as file:
            return call, json.load(file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per call (default 30)")
    parser.add_argument("--rounds", type=int, default=4, help="calls per mode (default 4)")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--shapes", action="store_true", help="profile with record_shapes=True")
    args = parser.parse_args()
    modes = {"off": False, "on": dict(record_shapes=True) if args.shapes else True}
    calls: dict[str, list[float]] = {m: [] for m in modes}
    steps: dict[str, list[float]] = {m: [] for m in modes}
    one_call(False, 2, args.nprocs)  # the fork server's start counts for neither
    for _ in range(args.rounds):
        for mode, profile in modes.items():
            call, times = one_call(profile, args.steps, args.nprocs)
            calls[mode].append(call)
            steps[mode] += times
    step = {m: statistics.median(v) * 1000 for m, v in steps.items()}
    call = {m: statistics.median(v) for m, v in calls.items()}
    print("| ranks | steps x calls per mode | median step, off (ms) | median step, on (ms) | on / off | "
          "median call, off (s) | median call, on (s) | on / off |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {args.nprocs} | {args.steps} x {args.rounds} | {step['off']:.2f} | {step['on']:.2f} | "
          f"{step['on'] / step['off']:.2f} | {call['off']:.2f} | {call['on']:.2f} | {call['on'] / call['off']:.2f} |")
    ppkit.cluster.spawn.call.close()


if __name__ == "__main__":
    main()
