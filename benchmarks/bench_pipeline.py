"""ppkit's warm pipeline sweep vs the tutorial's program (one mp.spawn per configuration).

Same work on both sides: for every micro-batch size, fresh ResNet50 shards on worker1 and worker2
(CPU), then ``--num-batches`` training steps (random images, one-hot labels, MSE, distributed
backward, SGD lr 0.05) driven by the master. The tutorial starts three new processes per
configuration; ppkit starts its RPC world once (timed separately) and reuses it, as a notebook does.
Also prints how close each measured pipeline (stages' first forward to last backward) is to the
bubble model's prediction from the measured stage times. One run, not a timed test; numbers from
a shared machine are noisy.

    python benchmarks/bench_pipeline.py                       # small sizes (default)
    python benchmarks/bench_pipeline.py --tutorial-sizes      # batch 120, 128x128, 3 batches
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_tutorial(args) -> tuple[float, dict[int, float]]:
    command = [sys.executable, str(HERE / "tutorial_pipeline.py"), "--batch-size", str(args.batch_size),
               "--image-size", str(args.image_size), "--num-batches", str(args.num_batches),
               "--port", str(args.port), "--microbatch-sizes", *map(str, args.microbatch_sizes)]
    # ppkit's workers wait passively in OpenMP (ppkit/cluster/worker_setup.py); give the tutorial's
    # processes the same setting, so the comparison is about the design, not a spin-wait.
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    total = time.time() - start
    if proc.returncode != 0:
        sys.exit(f"the tutorial's program failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    per_config = {int(m.group(1)): float(m.group(2)) for m in
                  re.finditer(r"number of splits = (\d+), execution time = ([0-9.]+)", proc.stdout)}
    return total, per_config


def run_ppkit(args):
    import ppkit
    from ppkit.pipeline.rpc.config import PipelineConfig
    from ppkit.pipeline.rpc.sweep import run_sweep

    config = PipelineConfig(batch_size=args.batch_size, image_size=args.image_size,
                            num_batches=args.num_batches, microbatch_sizes=tuple(args.microbatch_sizes),
                            placement="worker1:cpu,worker2:cpu").check()
    start = time.time()
    world = ppkit.start_rpc(num_workers=2)
    started = time.time()
    per_config = {}
    try:
        mark = [time.time()]

        def lap(run):
            now = time.time()
            per_config[run.microbatch_size] = now - mark[0]
            mark[0] = now

        result = run_sweep(config, rebuild=True, on_result=lap)
        swept = time.time()
    finally:
        world.close()
    return started - start, swept - started, per_config, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--num-batches", type=int, default=3)
    parser.add_argument("--microbatch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tutorial-sizes", action="store_true",
                        help="the tutorial's batch 120, 128x128 images, 3 batches, sizes 1 2 4 8")
    parser.add_argument("--port", type=int, default=29517, help="the tutorial's MASTER_PORT")
    parser.add_argument("--timeout", type=float, default=3600)
    args = parser.parse_args()
    if args.tutorial_sizes:
        args.batch_size, args.image_size, args.num_batches, args.microbatch_sizes = 120, 128, 3, [1, 2, 4, 8]

    sizes = " ".join(map(str, args.microbatch_sizes))
    print(f"batch {args.batch_size}, {args.image_size}x{args.image_size}, {args.num_batches} batches, "
          f"micro-batch sizes {sizes}; {os.cpu_count()} CPUs; OMP_WAIT_POLICY=PASSIVE on both sides",
          flush=True)
    tutorial_total, tutorial_configs = run_tutorial(args)
    print(f"tutorial program: {tutorial_total:.1f} s end to end", flush=True)
    start_s, sweep_s, ppkit_configs, result = run_ppkit(args)
    print(f"ppkit: {start_s:.1f} s to start the RPC world, {sweep_s:.1f} s warm sweep", flush=True)

    print("\n| micro-batch size | micro-batches | tutorial s (spawn + 3 processes + train) "
          "| ppkit s (warm: build shards + train) |")
    print("|---:|---:|---:|---:|")
    for run in result.runs:
        size = run.microbatch_size
        print(f"| {size} | {run.num_microbatches} | {tutorial_configs.get(size, float('nan')):.1f} "
              f"| {ppkit_configs[size]:.1f} |")
    print(f"| **all** | | **{tutorial_total:.1f}** (whole program) | **{sweep_s:.1f}** "
          f"(+ {start_s:.1f} to start the world once) |")
    print(f"\nppkit warm sweep is {tutorial_total / sweep_s:.2f}x faster end to end "
          f"({tutorial_total / (sweep_s + start_s):.2f}x counting the world's start).")

    print("\n| micro-batch size | micro-batches | s / batch | measured stages fwd+bwd s "
          "| bubble model s | measured / model | predicted bubble |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for run in result.runs:
        p = run.prediction
        print(f"| {run.microbatch_size} | {run.num_microbatches} | {run.seconds_per_batch:.2f} "
              f"| {run.measured_span:.2f} | {p.total:.2f} | {run.model_ratio:.2f} | {p.bubble:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
