"""``ppkit doctor``: check versions, interfaces and the way to the master, as a short table."""

from __future__ import annotations

import sys

from ppkit.errors import ConfigError

HELP = "check this machine for a multi-machine run: versions, interfaces, the master's address"


def add_arguments(parser) -> None:
    parser.add_argument("--master", metavar="ADDR:PORT",
                        help="the master's address, to check the route to it and that its port answers")
    parser.add_argument("--key", metavar="HEX",
                        help="the master's key (default: $PPKIT_KEY), to compare versions with it")


def main(args) -> int:
    from ppkit.cluster.tools.doctor import diagnose

    try:
        report = diagnose(args.master, key=args.key)
    except (ConfigError, ValueError) as exc:
        print(f"ppkit doctor: error: {exc}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1
