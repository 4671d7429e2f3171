"""The ``ppkit`` command. Each module in this package is one subcommand (``_`` in its name is
``-`` in the command's) and defines
``HELP``, ``add_arguments(parser)`` and ``main(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ppkit.errors import ConfigError


def _subcommands() -> dict:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            # slurm_script.py is `ppkit slurm-script`
            found[info.name.replace("_", "-")] = importlib.import_module(f"{__name__}.{info.name}")
    return found


def main(argv: list[str] | None = None) -> int:
    commands = _subcommands()
    parser = argparse.ArgumentParser(prog="ppkit", description="ppkit: learn PyTorch distributed training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in sorted(commands.items()):
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return commands[args.command].main(args) or 0
    except ConfigError as exc:  # a flag's value that a subcommand did not check itself: no traceback
        print(f"ppkit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ppkit: interrupted", file=sys.stderr)
        return 130
