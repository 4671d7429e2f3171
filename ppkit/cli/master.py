"""``ppkit master``: listen for remote workers, check the world with an all_reduce, then stop.

The first thing to run on two machines, before any training:

    machine A:  ppkit master --listen 10.0.0.1:29600            (prints the line for machine B)
    machine B:  PPKIT_KEY=... ppkit worker --connect 10.0.0.1:29600 --name worker1

It prints where every rank runs and the all_reduce result, and exits non-zero with the reason if
the workers cannot join.
"""

from __future__ import annotations

import sys

from ppkit.checks import positive
from ppkit.cluster.admission import DEFAULT_PORT
from ppkit.cluster.spec import cluster_spec
from ppkit.errors import ConfigError, PPKitError

HELP = "listen for remote workers and check the cluster with one all_reduce"


def add_arguments(parser) -> None:
    parser.add_argument("--listen", required=True, metavar="ADDR:PORT",
                        help=f"this machine's address that the workers reach, e.g. 10.0.0.1:{DEFAULT_PORT}")
    parser.add_argument("--workers", nargs="+", default=["worker1"], metavar="NAME",
                        help="the remote workers' names, in rank order (default: worker1)")
    parser.add_argument("--local-ranks", type=int, default=1, metavar="N",
                        help="ranks on this machine, before the remote ones (default 1)")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for the workers to join (default 60)")
    parser.add_argument("--key", metavar="HEX", help="the key workers must present (default: "
                        "$PPKIT_KEY, else a new one, printed)")


def main(args) -> int:
    from ppkit.cluster.controller import Cluster
    from ppkit.cluster.tools.allreduce_check import check, expected_sum

    world_size = args.local_ranks + len(args.workers)
    try:  # the flags first: a mistake there is a usage error (status 2), not a failed run
        if args.local_ranks < 0:
            raise ConfigError(f"--local-ranks must be 0 or more, got {args.local_ranks}.")
        positive(args.start_timeout, "--start-timeout")
        cluster_spec(world_size, "gloo", listen=args.listen, remote=args.workers, key=args.key)
    except ConfigError as exc:
        print(f"ppkit master: error: {exc}", file=sys.stderr)
        return 2
    try:
        with Cluster(world_size, "gloo", listen=args.listen, remote=args.workers, key=args.key,
                     start_timeout=args.start_timeout, timeout=60) as cluster:
            rows = cluster.run(check)
    except PPKitError as exc:
        print(f"ppkit master: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    names = {args.local_ranks + i: name for i, name in enumerate(args.workers)}  # ranks follow names
    expected = expected_sum(world_size)
    print(f"{'rank':>4}  {'name':<10} {'host':<12} {'pid':>7}  {'gloo interface':<15} all_reduce")
    for row in rows:
        print(f"{row['rank']:>4}  {names.get(row['rank'], 'master'):<10} {row['host']:<12} "
              f"{row['pid']:>7}  {row['iface']:<15} {row['sum']:g}")
    ok = all(row["sum"] == expected for row in rows)
    print(f"all_reduce(SUM) of rank+1 over {world_size} ranks: {rows[0]['sum']:g} "
          f"(expected {expected:g}) {'OK' if ok else 'WRONG'}")
    return 0 if ok else 1
