"""``ppkit bench``: nccl-tests-style bandwidth of gloo/NCCL operations, with raw TCP as the ceiling."""

from __future__ import annotations

import json
import sys

HELP = "measure p2p, all_reduce, all_gather and broadcast bandwidth (and raw TCP) on local ranks"


OPS_DEFAULT = "p2p,all_reduce,all_gather,broadcast"  # ppkit.bench.comm.OPS; not imported here: torch is slow


def add_arguments(parser) -> None:
    parser.add_argument("-n", "--world-size", type=int, default=2,
                        help="number of local ranks (default 2; p2p and tcp use ranks 0 and 1)")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl", "auto"),
                        help="process group backend (default gloo)")
    parser.add_argument("-b", "--min-bytes", default="4K", help="smallest message (default 4K)")
    parser.add_argument("-e", "--max-bytes", default="256M", help="largest message (default 256M)")
    parser.add_argument("-f", "--factor", type=int, default=2, help="size step factor (default 2)")
    parser.add_argument("--ops", default=OPS_DEFAULT, help=f"comma-separated operations (default {OPS_DEFAULT})")
    parser.add_argument("--no-tcp", action="store_true", help="skip the raw TCP ceiling")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed runs per size (default: 20 for small messages, down to 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed runs per size first")
    parser.add_argument("-r", "--repeats", type=int, default=3,
                        help="measure each size this many times, operations taking turns, and report "
                             "the median (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON to PATH")


def main(args) -> int:
    import ppkit
    from ppkit.bench import comm
    from ppkit.cluster.worker_setup import check_world_size

    try:
        sizes = comm.sizes(comm.parse_size(args.min_bytes), comm.parse_size(args.max_bytes), args.factor)
        ops = [op.strip() for op in args.ops.split(",") if op.strip()]
        unknown = [op for op in ops if op not in comm.OPS]
        if unknown:
            raise ppkit.ConfigError(f"unknown operation(s) {unknown}; choose from {', '.join(comm.OPS)}.")
        if args.iters is not None and args.iters < 1:
            raise ppkit.ConfigError(f"--iters must be at least 1, got {args.iters}.")
        if args.repeats < 1:
            raise ppkit.ConfigError(f"--repeats must be at least 1, got {args.repeats}.")
        check_world_size(args.world_size)
    except ppkit.ConfigError as exc:
        print(f"ppkit bench: error: {exc}", file=sys.stderr)
        return 2
    print(f"# ppkit bench: {args.world_size} local ranks, backend {args.backend}, "
          f"sizes {comm._human(sizes[0])}..{comm._human(sizes[-1])}, median of {args.repeats} "
          "measurement(s) per size", flush=True)
    with ppkit.Cluster(args.world_size, args.backend) as cluster:
        print(f"# backend in use: {cluster.backend}", flush=True)
        print(comm.HEADER, flush=True)
        rows = comm.run(cluster, ops, sizes, tcp=not args.no_tcp, iters=args.iters, warmup=args.warmup,
                        repeats=args.repeats, on_row=lambda row: print(comm.format_row(row), flush=True))
    print()
    print(comm.summary(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"# rows written to {args.json}")
    return 0
