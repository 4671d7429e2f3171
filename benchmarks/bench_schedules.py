"""RPC vs GPipe vs 1F1B on the same ResNet50 split, batch and micro-batches, side by side.

For every size: one warm-up step and ``--steps`` timed steps of each schedule in turn, ``--rounds``
times (so a machine that gets busier or quieter affects all of them alike). Prints Markdown: time
per step (median and range over the timed steps), idle share measured / bubble model / equal-stage
formula, activation peaks per stage, and the largest gradient difference from a local ResNet50
(eval-mode BatchNorm, no optimizer step). One run, not a timed test; a shared machine is noisy.

    python benchmarks/bench_schedules.py
    python benchmarks/bench_schedules.py --sizes 16x64x4 16x64x8 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse_size(text: str) -> tuple[int, int, int]:
    try:
        batch, image, microbatches = (int(part) for part in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write BATCHxIMAGExMICROBATCHES, e.g. 8x32x4") from None
    return batch, image, microbatches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(8, 32, 4), (16, 64, 4), (16, 64, 8)],
                        metavar="BxIxM", help="batch size x image side x number of micro-batches")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per schedule and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cut", default="layer2")
    args = parser.parse_args()

    import ppkit
    from ppkit.pipeline import PipelineModel
    from ppkit.pipelining import compare, report, stage, verify

    print(f"{os.cpu_count()} CPUs, one thread per stage, cut after {args.cut}, {args.rounds} rounds x "
          f"{args.steps} timed steps per schedule, torch {__import__('torch').__version__}\n", flush=True)
    start = time.time()
    with ppkit.Cluster(2, "gloo") as cluster, ppkit.start_rpc(num_workers=2), \
            PipelineModel("worker1:cpu,worker2:cpu", cut=args.cut) as model:
        print(f"worlds ready in {time.time() - start:.1f} s\n")
        print("| batch | image | micro-batches | schedule | s / step (median, range) | idle measured "
              "| bubble model | equal stages | activations stage 1 | activations stage 2 | grad diff |")
        print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for batch, image, microbatches in args.sizes:
            x, y = stage.make_batch(batch, image)
            reference = verify.reference_step(x, y, args.cut)
            runs = compare.compare_schedules(cluster, model, x, y, microbatches, steps=args.steps,
                                             rounds=args.rounds, timeout=600)
            rows = report.table_rows(runs)
            for (name, run), row in zip(runs.items(), rows):
                times = run.step_times
                diff = verify.grad_difference(run.grads, reference["grads"])
                print(f"| {batch} | {image} | {microbatches} | {name} | {run.step_time:.3f} "
                      f"({min(times):.3f}-{max(times):.3f}) | {' | '.join(row[3:])} | {diff:.1e} |",
                      flush=True)
    print(f"\ntotal {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
