"""Notebook 12's targets, measured in one run: the MoE layer's all_to_alls carry the counted tokens and
nothing else, and what routing skew and the capacity factor do to the step time.

The expert-parallel layer forward + backward (``ppkit.lessons.moe_timing.measure``) on ranks of one
cluster, each rank computing with one thread. While it runs, every rank's ``dist.all_to_all_single`` is
wrapped to add up the bytes of every tensor handed to it, apart from the lesson's own record:

- bytes check: token rows handed to all_to_all_single (dispatch and combine, forward and backward) over
  the counted kept (token, choice) pairs x hidden x element size x 4; target exactly 1.000 (no hidden
  copies, no padding). The count exchange (int64, E numbers per rank) is shown apart, and so are the bytes
  that fixed-capacity buffers (experts x capacity rows from every rank, as in GShard) would send;
- step time: the slowest rank's forward + backward (the fastest of the repeats), per setting of router skew
  and capacity factor, with the drops and the busiest rank's rows over the mean.

    python benchmarks/bench_expert_parallel.py                 # 2 ranks, 8 experts, 2048 tokens per rank
    python benchmarks/bench_expert_parallel.py --ranks 4 --repeats 7

Exit status 0 whatever the numbers (a shared machine is noisy); the bytes line says met/not met.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

SETTINGS = ((0.0, 1.25), (0.0, 4.0), (2.0, 1.0), (2.0, 1.25), (2.0, 4.0), (4.0, 4.0))  # (skew, capacity factor)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _wrap_all_to_all(rank, world_size):
    """Count the bytes of every tensor this rank hands to dist.all_to_all_single, by kind."""
    import torch.distributed as dist

    real = getattr(dist, "_bench_real_all_to_all_single", dist.all_to_all_single)
    counted = {"rows": 0, "counts": 0, "calls": 0}

    def counting(output, input, *args, **kwargs):
        counted["rows" if input.is_floating_point() else "counts"] += input.nbytes
        counted["calls"] += 1
        return real(output, input, *args, **kwargs)

    dist._bench_real_all_to_all_single, dist._bench_counted = real, counted
    dist.all_to_all_single = counting


def _unwrap(rank, world_size):
    import torch.distributed as dist

    dist.all_to_all_single = dist._bench_real_all_to_all_single
    return dist._bench_counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks holding experts (default 2: one per core here)")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per setting, after a warm-up")
    args = parser.parse_args()

    import ppkit
    from ppkit.lessons import moe_timing

    print(f"expert-parallel MoE forward + backward: {args.ranks} ranks, {args.experts} experts, top-{args.top_k}, "
          f"{args.tokens} tokens per rank, hidden {args.hidden}, ffn {args.ffn}, {args.repeats} repeats; "
          f"{os.cpu_count()} CPUs, load average {_load():.1f} at start", flush=True)
    start = time.time()
    runs = []
    with ppkit.Cluster(args.ranks, "gloo", timeout=300) as cluster:
        for skew, capacity in SETTINGS:
            cluster.run(_wrap_all_to_all)
            m = moe_timing.measure(cluster, args.experts, args.ranks, args.top_k, capacity, skew, args.tokens,
                                   args.hidden, args.ffn, repeats=args.repeats, timeout=600)
            counted = cluster.run(_unwrap)
            steps = args.repeats + 1  # the warm-up step went through the wrapper too
            rows = sum(c["rows"] for c in counted) / steps
            counts = sum(c["counts"] for c in counted) / steps
            runs.append((m, rows, counts))
            print(f"  {m.summary()}", flush=True)
    print(f"\ntook {time.time() - start:.0f} s; load average {_load():.1f} at the end\n")

    print("| skew | capacity factor | dropped pairs | busiest / mean rows | step ms | all_to_all ms (slowest rank) "
          "| row bytes handed over | counted pairs x hidden x 4 B x 4 | ratio | fixed-capacity bytes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, rows, _ in runs:
        comm = max(sum(v for k, v in ph.items() if k in moe_timing.COMM) for ph in m.phases)
        print(f"| {m.settings.skew:g} | {m.settings.capacity_factor:g} | {m.dropped_pairs} of "
              f"{m.ranks * m.settings.tokens * m.settings.top_k} | {m.imbalance:.2f} | {m.step_s * 1e3:.0f} "
              f"| {comm * 1e3:.0f} | {rows:,.0f} | {m.counted_bytes:,} | {rows / m.counted_bytes:.3f} "
              f"| {m.padded_bytes:,} |")

    worst = max(abs(rows / m.counted_bytes - 1) for m, rows, _ in runs)
    base = runs[0][0].step_s
    print(f"\ntarget: bytes handed to all_to_all_single for token rows = counted pairs x hidden x element size x 4, "
          f"in every setting: largest |ratio - 1| = {worst:.3f} -> {'met' if worst == 0 else 'NOT met'}")
    print(f"count exchange: {runs[0][2]:,.0f} bytes per step over all ranks (int64, experts x ranks), apart")
    print("step time relative to skew 0, capacity factor 1.25: " + ", ".join(
        f"skew {m.settings.skew:g}/cf {m.settings.capacity_factor:g} {m.step_s / base:.2f}" for m, _, _ in runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
