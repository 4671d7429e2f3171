"""The flight recorder's cost: a DDP training step with torch's flight recorder on (TORCH_FR_BUFFER_SIZE=1000;
torch records by default, 2000 entries, and ppkit reads it) against off (0), in one run
(ppkit/transport/flight_record.py).

    python benchmarks/bench_flight_recorder.py                 # 2 ranks, 40 steps per call, 4 rounds
    python benchmarks/bench_flight_recorder.py --steps 60 --rounds 6

Each round makes two ``ppkit.spawn`` calls of the same function, recorder on and off, in turns so that a
machine that gets busier or quieter affects both (which goes first alternates). Inside each call rank 0 times
every step of a small DDP MLP (4 x Linear(512, 512), batch 64, buckets of 1 MB: several all_reduces a step) and
counts the entries the recorder kept, which shows that the setting took. Prints the median step of each mode and
the ratio.
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


def ddp_steps(rank: int, world_size: int, port: int, steps: int, buffer: str, out: str) -> None:
    import pickle

    import torch
    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel

    os.environ["TORCH_FR_BUFFER_SIZE"] = buffer  # read once, when the first process group is made
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[layer for _ in range(4) for layer in (torch.nn.Linear(512, 512), torch.nn.ReLU())])
    model = DistributedDataParallel(net, bucket_cap_mb=1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(64, 512)
    seconds = []
    for _ in range(steps + 2):  # two warm-up steps: DDP's first builds its buckets
        start = time.perf_counter()
        sgd.zero_grad()
        model(batch).square().mean().backward()
        sgd.step()
        seconds.append(time.perf_counter() - start)
    kept = len(pickle.loads(c10d._dump_fr_trace(includeStackTraces=False)).get("entries", []))
    if rank == 0:
        with open(out, "w") as file:
            json.dump({"seconds": seconds[2:], "entries": kept}, file)
    dist.destroy_process_group()


def one_call(buffer: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "steps.json")
        ppkit.spawn(ddp_steps, args=(2, free_port(), steps, buffer, out), nprocs=2, timeout=600)
        with open(out) as file:
            return json.load(file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per call (default 40)")
    parser.add_argument("--rounds", type=int, default=4, help="calls per mode (default 4)")
    args = parser.parse_args()
    modes = {"on": "1000", "off": "0"}
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    entries: dict[str, int] = {}
    for round_ in range(args.rounds):
        for mode in (("on", "off") if round_ % 2 == 0 else ("off", "on")):  # neither always goes first
            buffer = modes[mode]
            got = one_call(buffer, args.steps)
            seconds[mode] += got["seconds"]
            entries[mode] = got["entries"]
    on, off = (statistics.median(seconds[m]) * 1e3 for m in ("on", "off"))
    print(f"entries kept by rank 0: on {entries['on']}, off {entries['off']}")
    print("| steps per mode | median step, recorder off (ms) | median step, recorder on (ms) | on / off |")
    print("|---|---|---|---|")
    print(f"| {len(seconds['on'])} | {off:.2f} | {on:.2f} | {on / off:.3f} |")


if __name__ == "__main__":
    main()
