"""RPC vs GPipe vs 1F1B on the same ResNet50 split, batch and micro-batches, side by side; then all
six torch.distributed.pipelining schedules, the four past 1F1B with two stages per rank.

For every size: one warm-up step and ``--steps`` timed steps of each schedule in turn, ``--rounds``
times (so a machine that gets busier or quieter affects all of them alike). Prints Markdown: time
per step (median and range over the timed steps), idle share measured / bubble model / equal-stage
formula, activation peaks per stage, and the largest gradient difference from a local ResNet50
(eval-mode BatchNorm, no optimizer step). The second table adds each schedule's step time over
1F1B's, as the median of the ratios within each round, and what splitting the backward into I and W
cost (InterleavedZeroBubble's I + W over Interleaved1F1B's whole backward, same stages). One run, not
a timed test; a shared machine is noisy.

    python benchmarks/bench_schedules.py
    python benchmarks/bench_schedules.py --sizes 16x64x4 16x64x8 --rounds 3 --part looped
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


def looped_table(cluster, batch: int, image: int, microbatches: int, args) -> None:
    """All six schedules on one size: the table, the ratios to 1F1B within rounds, the cost of the split."""
    import statistics

    from ppkit.pipeline.schedules import compare, looped_report, stage, verify

    x, y = stage.make_batch(batch, image)
    runs = compare.compare_looped(cluster, x, y, microbatches, steps=args.steps, rounds=args.rounds, timeout=600)
    print(f"\nbatch {batch} of {image}x{image}, {microbatches} micro-batches, load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| schedule | stages/rank | s / step (median, range) | vs 1F1B (median of round ratios) "
          "| computing s per rank | idle measured | bubble model | torch plan, equal stages "
          "| formula, equal stages | activations per rank | grad diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = runs["1f1b"].round_times
    for (name, run), row in zip(runs.items(), looped_report.table_rows(runs)):
        ratio = statistics.median(t / b for t, b in zip(run.round_times, base))
        diff = verify.grad_difference(run.grads, verify.reference_step(x, y, run.cuts)["grads"])
        print(f"| {name} | {row[1]} | {run.step_time:.3f} ({min(run.step_times):.3f}-{max(run.step_times):.3f}) "
              f"| {ratio:.2f} | {' | '.join(row[3:])} | {diff:.1e} |", flush=True)
    whole, split = runs["interleaved1f1b"].op_times(), runs["interleavedzerobubble"].op_times()
    parts = [(whole[(s, "B")], split[(s, "I")] + split[(s, "W")]) for s in range(4)]
    print("\nsplitting the backward (last round): I + W over the whole backward, per stage: "
          + ", ".join(f"{b * 1e3:.1f} -> {iw * 1e3:.1f} ms ({iw / b:.2f}x)" for b, iw in parts)
          + f"; all stages {sum(iw for _, iw in parts) / sum(b for b, _ in parts):.2f}x", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[(8, 32, 4), (16, 64, 4), (16, 64, 8)],
                        metavar="BxIxM", help="batch size x image side x number of micro-batches")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per schedule and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cut", default="layer2")
    parser.add_argument("--part", choices=("rpc", "looped", "both"), default="both",
                        help="rpc: RPC vs GPipe vs 1F1B; looped: the six pipelining schedules; both (default)")
    args = parser.parse_args()

    import ppkit
    from ppkit.pipeline.rpc import PipelineModel
    from ppkit.pipeline.schedules import compare, report, stage, verify

    print(f"{os.cpu_count()} CPUs, one thread per stage, cut after {args.cut}, {args.rounds} rounds x "
          f"{args.steps} timed steps per schedule, torch {__import__('torch').__version__}, load average "
          f"{os.getloadavg()[0]:.1f}\n", flush=True)
    start = time.time()
    if args.part in ("rpc", "both"):
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
    if args.part in ("looped", "both"):
        with ppkit.Cluster(2, "gloo") as cluster:
            for batch, image, microbatches in args.sizes:
                looped_table(cluster, batch, image, microbatches, args)
    print(f"\ntotal {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
