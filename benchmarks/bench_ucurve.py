"""The pipeline lesson's targets, measured in one run: the U-curve at the default cut and at the
auto cut, each stage process on its own cores.

For each cut: the no-overlap reference (the whole batch as one micro-batch, same shards, same
resources), every count of micro-batches in rounds, the bubble bound from the solo stage times,
the fitted per-micro-batch overhead. Then the targets as ratios (not timed tests):

- the best count is at least 1.5x faster per training step than the reference,
- and within 15% of the bubble bound at that count (measured speed-up >= 0.85 x bound speed-up),
- with the auto cut both the bound and the measured speed-up are higher than at the default cut.

    python benchmarks/bench_ucurve.py                                 # batch 32 of 64x64
    python benchmarks/bench_ucurve.py --plot docs/pipeline_ucurve.png --markdown
    python benchmarks/bench_ucurve.py --tutorial-sizes                # batch 120 of 128x128

Exit status 0 whatever the numbers (a shared machine is noisy); each target line says met/not met.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

MIN_SPEEDUP = 1.5
WITHIN_BOUND = 0.85


def measure(config, counts, rounds, say):
    from ppkit.pipeline.rpc.resources import describe
    from ppkit.pipeline.rpc.sweep import build_model
    from ppkit.pipeline.rpc.ucurve import measure_ucurve

    model, optimizer = build_model(config)
    try:
        say(f"stage resources: {describe(model.resources)}")
        return measure_ucurve(model, optimizer, config, counts, rounds=rounds)
    finally:
        model.close()


def report(curve, markdown: bool) -> None:
    print(curve.format_table(markdown))
    print(curve.reference.describe())
    print(curve.overhead_line())
    print(curve.summary(), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per count (median)")
    parser.add_argument("--num-microbatches", type=int, nargs="+", default=None)
    parser.add_argument("--tutorial-sizes", action="store_true", help="batch 120 of 128x128")
    parser.add_argument("--stage-threads", default="auto")
    parser.add_argument("--plot", metavar="PNG", help="save the default cut's U-curve figure here")
    parser.add_argument("--markdown", action="store_true", help="tables in Markdown")
    args = parser.parse_args()
    if args.tutorial_sizes:
        args.batch_size, args.image_size = 120, 128
        args.num_microbatches = args.num_microbatches or [1, 2, 4, 8, 15, 30, 60, 120]

    import ppkit
    from ppkit.models.resnet import DEFAULT_CUT
    from ppkit.pipeline.rpc.balance import format_candidates, measure_cuts, pick
    from ppkit.pipeline.rpc.config import PipelineConfig
    from ppkit.pipeline.rpc.ucurve import default_counts, sizes_for_counts

    counts = args.num_microbatches or list(default_counts(args.batch_size))
    sizes = tuple(size for _, size in sizes_for_counts(args.batch_size, counts))
    config = PipelineConfig(batch_size=args.batch_size, image_size=args.image_size, num_batches=args.rounds,
                            microbatch_sizes=sizes, placement="worker1:cpu,worker2:cpu", cut=DEFAULT_CUT,
                            stage_threads=args.stage_threads).check()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"batch {args.batch_size} of {args.image_size}x{args.image_size}, counts {' '.join(map(str, counts))}, "
          f"{args.rounds} rounds, {os.cpu_count()} CPUs, load average {load:.1f} at start", flush=True)
    start = time.time()
    world = ppkit.start_rpc(2)
    try:
        print(f"\n## cut after {DEFAULT_CUT} (default)", flush=True)
        default = measure(config, counts, args.rounds, print)
        report(default, args.markdown)
        if args.plot:
            from ppkit.pipeline.plots import ucurve_figure

            ucurve_figure(default).savefig(args.plot, dpi=100)
            print(f"plot saved to {args.plot}")
        print("\n## --cut auto", flush=True)
        candidates = measure_cuts(config, rounds=max(1, args.rounds // 2))
        print(format_candidates(candidates, args.markdown))
        chosen = pick(candidates).cut
        if chosen == DEFAULT_CUT:
            auto = default
            print(f"auto picks {chosen}, the default: same curve as above")
        else:
            auto = measure(config.replace(cut=chosen), counts, args.rounds, print)
            report(auto, args.markdown)
    finally:
        world.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\ntook {time.time() - start:.0f} s; load average {load:.1f} at the end")

    def verdict(ok):
        return "met" if ok else "NOT met"

    best = default.best
    speedup = default.speedup(best)
    bound = default.reference.bound_speedup(best.num_microbatches)
    auto_speedup = auto.speedup(auto.best)
    auto_bound = auto.reference.bound_speedup(auto.best.num_microbatches)
    print(f"target: best count >= {MIN_SPEEDUP}x over no overlap: {speedup:.2f}x -> {verdict(speedup >= MIN_SPEEDUP)}")
    print(f"target: within 15% of the bubble bound: {speedup:.2f}x / {bound:.2f}x = {speedup / bound:.2f} -> "
          f"{verdict(speedup >= WITHIN_BOUND * bound)}")
    print(f"target: --cut auto ({chosen}) raises bound and speed-up: bound {bound:.2f}x -> {auto_bound:.2f}x, "
          f"measured {speedup:.2f}x -> {auto_speedup:.2f}x -> "
          f"{verdict(auto_bound > bound and auto_speedup > speedup)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
