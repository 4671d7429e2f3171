"""torchrun's command line, read with torchrun's own parser, into what a ``%%torchrun`` run needs.

torch's parser knows every spelling (``--nproc-per-node 2``, ``--nproc_per_node=2``, ``--master-port``,
``--standalone``); ``--nnodes N`` runs the ranks on N nodes of a SLURM cluster (nodes.py). What a run
without torchrun's agent cannot honour is refused by name; options that only steer the agent (how it
monitors, restarts or logs) change nothing here and are accepted, so a tutorial's command line can be
pasted as it is.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

from ppkit.cluster.spec import DEFAULT_TIMEOUT_S
from ppkit.errors import ConfigError

CELL = "<%%torchrun cell>"  # stands for the script when the cell is the script
# options whose only effect is on torchrun's agent, not on what its workers see
AGENT_ONLY = {"rdzv_backend", "rdzv_endpoint", "rdzv_conf", "monitor_interval", "start_method",
              "event_log_handler", "log_line_prefix_template", "signals_to_handle", "shutdown_timeout",
              "run_path"}
# options this run reads (nnodes as one number: nnodes() refuses an elastic range)
HONOURED = {"nproc_per_node", "master_addr", "master_port", "rdzv_id", "role", "timeout", "standalone", "nnodes",
            "training_script", "training_script_args"}
WHY_NOT = {
    "nnodes": "ppkit does not grow or shrink a run (torchrun's elastic MIN:MAX); give one number of nodes: "
              "--nnodes 1 on this machine, --nnodes 2 for two nodes of a SLURM cluster",
    "node_rank": "one cell starts every node's ranks, so no node is given its rank by hand: with --nnodes N each "
                 "node's rank is its place in the SLURM job (SLURM_NODEID)",
    "max_restarts": "ppkit does not restart failed ranks: a failure raises in the cell; re-run the cell",
    "module": "-m is not supported: run the module's file, or import it from the cell",
    "no_python": "--no-python is not supported: the ranks are Python processes forked from ppkit's fork server",
    "redirects": "every rank's output already appears in the cell as [rank i]",
    "tee": "every rank's output already appears in the cell as [rank i]",
    "log_dir": "output is not written to files; every rank's output appears in the cell as [rank i]",
}


@dataclass(frozen=True)
class Launch:
    """One run: how many ranks, where they meet, the script and its arguments."""

    nproc_per_node: int
    master_addr: str
    master_port: int | None  # None: a free port, picked for each run as torchrun does
    run_id: str
    role: str
    timeout: float
    script: str  # CELL, or a file's path as written
    script_args: tuple[str, ...]
    nnodes: int = 1  # more than 1: nproc_per_node ranks on each of that many SLURM nodes (nodes.py)


def parser():
    """torchrun's parser, with ppkit's ``--timeout`` and errors that raise instead of exiting."""
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser()
    parsed.prog = "torchrun"
    parsed.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="ppkit's own: seconds before the run is stopped and each rank says where it waited")

    def error(message):
        raise ConfigError(f"{message}. Write the options as for torchrun: --nproc-per-node 2 [--master-port 29500] "
                          "[--standalone] [--timeout S]")

    parsed.error = error
    return parsed


def parse(argv: list[str], cell: bool) -> Launch | None:
    """``argv``: torchrun's arguments; for a cell, its options then ``--`` and the script's arguments.

    Returns None when ``-h`` printed the help."""
    if cell:  # the cell stands where torchrun's script would: options, CELL, the script's arguments
        split = argv.index("--") if "--" in argv else len(argv)
        argv = [*argv[:split], CELL, *argv[split + 1:]]
    try:
        args = parser().parse_args(argv)
    except SystemExit:  # -h: argparse printed the help
        return None
    if cell and args.training_script != CELL:
        raise ConfigError(
            f"%%torchrun runs the cell itself, so {args.training_script!r} cannot be a script to run. Put the "
            "script's own arguments after --: %%torchrun --nproc-per-node 2 -- --epochs 3. To run a file, write "
            f"%torchrun --nproc-per-node 2 {args.training_script} (one %).")
    refuse(args)
    return Launch(nproc_per_node(args.nproc_per_node), args.master_addr, _port(args), _run_id(args), args.role,
                  positive_timeout(args.timeout), args.training_script, tuple(args.training_script_args),
                  nnodes(args))


def refuse(args) -> None:
    """Raise for the first option that is set and cannot be honoured here."""
    defaults = parser().parse_args([CELL])
    for name, value in vars(args).items():
        if name in AGENT_ONLY or name in HONOURED or value == getattr(defaults, name):
            continue
        flag = "--" + name.replace("_", "-")
        why = WHY_NOT.get(name, "this option of torchrun is not supported by ppkit's %%torchrun")
        raise ConfigError(f"{flag} {value}: {why}. Leave it out, or run the script with torchrun itself "
                          "(!torchrun ... in a cell).")


def nproc_per_node(value: str) -> int:
    if value in ("cpu", "auto"):  # torchrun: one per CPU when there is no GPU
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"--nproc-per-node {value}: give a number of processes, at least 1 (or cpu, auto); "
                          "one per GPU (gpu) needs GPUs, which %%torchrun does not place.")
    return count


def nnodes(args) -> int:
    """torchrun's ``--nnodes``: ``N`` or ``N:N``; a range MIN:MAX is elastic, which is not done here."""
    low, _, high = str(args.nnodes).partition(":")
    count = int(low) if low.isdigit() and (not high or high == low) else 0
    if count < 1:
        raise ConfigError(f"--nnodes {args.nnodes}: {WHY_NOT['nnodes']}.")
    if count > 1 and args.standalone:
        raise ConfigError(f"--standalone --nnodes {count}: --standalone is torchrun's run on one node. Leave "
                          "--standalone out to run on several nodes (of a SLURM cluster).")
    return count


def positive_timeout(value: float) -> float:
    if not value > 0:
        raise ConfigError(f"--timeout {value:g}: give the seconds the run may take, more than 0, e.g. --timeout 300.")
    return value


def _port(args) -> int | None:
    if args.master_port is None:
        return None
    if not 0 < args.master_port < 65536:
        raise ConfigError(f"--master-port {args.master_port}: a TCP port is 1 to 65535, e.g. --master-port 29500.")
    return args.master_port


def new_run_id() -> str:
    """A run id of its own, as torchrun --standalone makes one."""
    return str(uuid.uuid4())


def _run_id(args) -> str:
    return new_run_id() if args.standalone or args.rdzv_id == "none" else args.rdzv_id
