"""torchrun's command line, read with torchrun's own parser, into what a ``%%torchrun`` run needs.

torch's parser knows every spelling (``--nproc-per-node 2``, ``--nproc_per_node=2``, ``--master-port``,
``--standalone``); ``--nnodes N`` runs the ranks on N nodes of a SLURM cluster (nodes.py). What a run
without torchrun's agent cannot honour is refused by name, with what to do instead; options that only
steer the agent and have nothing to steer here (how often it polls its workers) are accepted with a note
that says so, so a tutorial's command line can be pasted as it is and nothing is dropped silently.
Output options: output_options.py.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field

from ppkit.cluster.output import PLAIN, OutputSettings
from ppkit.cluster.torchrun import output_options
from ppkit.errors import ConfigError

CELL = "<%%torchrun cell>"  # stands for the script when the cell is the script
# options that steer only torchrun's agent, with nothing to steer here: accepted, with this note
NO_EFFECT = {
    "monitor_interval": "ppkit learns of a rank's exit when it happens, with nothing to poll",
    "start_method": "every rank is forked from ppkit's fork server (torch imported once), whatever the method",
    "event_log_handler": "ppkit has no agent whose events to log",
    "signals_to_handle": "Kernel > Interrupt stops every rank; a failed rank's partners get SIGTERM, then SIGKILL",
    "shutdown_timeout": "ppkit's own grace period between SIGTERM and SIGKILL applies",
    "local_addr": "every rank of a run on this machine reaches the store at --master-addr",
}
# options this run reads (nnodes as one number: nnodes() refuses an elastic range; rdzv_backend: static
# or c10d, both a TCP store that rank 0 hosts here)
HONOURED = {"nproc_per_node", "master_addr", "master_port", "rdzv_id", "role", "timeout", "standalone", "nnodes",
            "training_script", "training_script_args", "rdzv_endpoint", "rdzv_backend", "run_path", "module",
            "tee", "redirects", "log_dir", "local_ranks_filter", "log_line_prefix_template", "no_collapse",
            "print_completion", "profile", "profile_shapes", "max_restarts"}
WHY_NOT = {
    "nnodes": "ppkit does not grow or shrink a run (torchrun's elastic MIN:MAX); give one number of nodes: "
              "--nnodes 1 on this machine, --nnodes 2 for two nodes of a SLURM cluster",
    "node_rank": "one cell starts every node's ranks, so no node is given its rank by hand: with --nnodes N each "
                 "node's rank is its place in the SLURM job (SLURM_NODEID)",
    "no_python": "--no-python is not supported: the ranks are Python processes forked from ppkit's fork server. "
                 "Run a Python script or module (-m), or the program from a Python script with subprocess",
    "rdzv_conf": "ppkit's rendezvous (a TCP store on rank 0) has no settings to change; leave it out, and give "
                 "--timeout S to bound a run",
    "logs_specs": "ppkit has no LogsSpecs plug-ins; --log-dir, --tee and --redirects write each rank's files",
    "numa_binding": "ppkit does not bind ranks to NUMA nodes; bind in the script (os.sched_setaffinity)",
    "virtual_local_rank": "LOCAL_RANK stays each rank's place on the node; pick the GPU in the script "
                          "(torch.cuda.set_device(int(os.environ['LOCAL_RANK'])))",
    "duplicate_stdout_filters": "ppkit does not copy matching lines to a file of their own; --tee 3 --log-dir DIR "
                                "keeps every line of each rank, to search afterwards",
    "duplicate_stderr_filters": "ppkit does not copy matching lines to a file of their own; --tee 3 --log-dir DIR "
                                "keeps every line of each rank, to search afterwards",
}


@dataclass(frozen=True)
class Launch:
    """One run: how many ranks, where they meet, the script and its arguments."""

    nproc_per_node: int
    master_addr: str
    master_port: int | None  # None: a free port, picked for each run as torchrun does
    run_id: str
    role: str
    timeout: float | None  # None: no limit
    script: str  # CELL, or a file's path as written
    script_args: tuple[str, ...]
    nnodes: int = 1  # more than 1: nproc_per_node ranks on each of that many SLURM nodes (nodes.py)
    module: bool = False  # -m: script is a module's name, run as python -m runs it
    output: OutputSettings = PLAIN  # what reaches the cell and the files (output_options.py)
    notes: tuple[str, ...] = field(default=(), compare=False)  # options accepted that change nothing here
    profile: object = None  # a profiling.collect.Request: every rank under torch.profiler (--profile)
    max_restarts: int = 0  # --max-restarts: the whole group started again after a failure, up to this often


def parser():
    """torchrun's parser, with ppkit's ``--timeout`` and errors that raise instead of exiting."""
    from torch.distributed.run import get_args_parser

    parsed = get_args_parser()
    parsed.prog = "torchrun"
    parsed.add_argument("--timeout", type=float, default=None,
                        help="ppkit's own: seconds before the run is stopped and each rank says where it waited "
                             "(default: no limit, as under torchrun; 0: no limit)")

    def error(message):
        raise ConfigError(f"{message}. Write the options as for torchrun: --nproc-per-node 2 [--master-port 29500] "
                          "[--standalone] [--timeout S]")

    parsed.error = error
    parsed.add_argument("--profile", action="store_true",
                        help="ppkit's own: run every rank under torch.profiler; the cell's value is a ppkit.Profile, "
                             "one timeline of every rank (docs/profiling.md)")
    parsed.add_argument("--profile-shapes", action="store_true",
                        help="ppkit's own: the same as --profile, which records each op's input shapes")
    output_options.add_arguments(parsed)
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
    if cell and args.module:
        raise ConfigError("-m runs a module, and %%torchrun runs the cell itself. Write %torchrun "
                          "--nproc-per-node 2 -m package.train [args] (one %), or import the module in the cell.")
    if cell and args.training_script != CELL:
        raise ConfigError(
            f"%%torchrun runs the cell itself, so {args.training_script!r} cannot be a script to run. Put the "
            "script's own arguments after --: %%torchrun --nproc-per-node 2 -- --epochs 3. To run a file, write "
            f"%torchrun --nproc-per-node 2 {args.training_script} (one %).")
    notes = refuse(args)
    nproc, count, run_id = nproc_per_node(args.nproc_per_node), nnodes(args), _run_id(args)
    addr, port = _rendezvous(args)
    return Launch(nproc, addr, port, run_id, args.role,
                  positive_timeout(args.timeout), args.training_script, tuple(args.training_script_args),
                  count, bool(args.module), output_options.settings(args, nproc, count, run_id), notes,
                  _profile(args), max_restarts(args.max_restarts, count))


def _profile(args):
    from ppkit.profiling import collect

    return collect.request({"record_shapes": True} if args.profile_shapes else args.profile)


def refuse(args) -> tuple[str, ...]:
    """Raise for the first option that is set and cannot be honoured here; the notes for those that
    are accepted but change nothing here."""
    defaults, notes = parser().parse_args([CELL]), []
    for name, value in vars(args).items():
        if name in HONOURED or value == getattr(defaults, name):
            continue
        flag = "--" + name.replace("_", "-")
        if name in NO_EFFECT:
            notes.append(f"[ppkit] {flag} {value} changes nothing here: {NO_EFFECT[name]}.")
            continue
        why = WHY_NOT.get(name, "this option of torchrun is not supported by ppkit's %%torchrun")
        raise ConfigError(f"{flag} {value}: {why}. Leave it out, or run the script with torchrun itself "
                          "(!torchrun ... in a cell).")
    if args.rdzv_backend not in ("static", "c10d"):
        raise ConfigError(f"--rdzv-backend {args.rdzv_backend}: ppkit's rank 0 hosts the rendezvous in a TCP store, "
                          "as torchrun's c10d backend does. Write --rdzv-backend c10d, or leave it out.")
    if args.standalone and args.rdzv_endpoint:
        notes.append(f"[ppkit] --rdzv-endpoint {args.rdzv_endpoint} is not used with --standalone, as under torchrun: "
                     "the store is on 127.0.0.1, on a free port. Leave --standalone out to use the endpoint.")
    return tuple(notes)


def nproc_per_node(value: str) -> int:
    """A number; ``gpu``: one per GPU; ``auto``: one per GPU, else the learner's CPU budget
    (cluster/budget.py); ``cpu``: one per core. Never more than the cores this kernel may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if value in ("auto", "gpu"):
        import torch

        gpus = torch.cuda.device_count()
        if gpus:
            return gpus
        if value == "gpu":
            raise ConfigError("--nproc-per-node gpu: this machine has no GPU that torch sees "
                              "(torch.cuda.device_count() is 0). Give a number, or auto (the CPU budget here).")
        from ppkit.cluster.budget import read_budget

        return max(1, min(cores, math.floor(read_budget().cores)))
    if value == "cpu":
        return cores
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ConfigError(f"--nproc-per-node {value}: give a number of processes, at least 1, or auto (one per GPU, "
                          "else the CPU budget), gpu or cpu.")
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


def max_restarts(value, nnodes: int = 1, flag: str = "--max-restarts") -> int:
    """How often the whole group may start again after a failure (torchrun/restarts.py): 0 or more."""
    shown = f"{flag}{value!r}" if flag.endswith("=") else f"{flag} {value}"
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{shown}: give how many times every rank may start again after a failure, "
                          "0 or more, e.g. --max-restarts 2 (3 attempts in all).")
    if value and nnodes > 1:
        raise ConfigError(f"{shown} with {nnodes} nodes: ppkit restarts the ranks of a run on this machine "
                          "only. Leave --max-restarts out, or run on one node (--nnodes 1).")
    return value


def positive_timeout(value: float | None) -> float | None:
    """None (no limit: left out, or 0) or the seconds the run may take."""
    if value is None or value == 0:
        return None
    if not 0 < value < float("inf"):
        raise ConfigError(f"--timeout {value:g}: give the seconds the run may take, more than 0, e.g. --timeout 300, "
                          "or leave it out for no limit (as under torchrun).")
    return value


def _rendezvous(args) -> tuple[str, int | None]:
    """Where rank 0 hosts the store: ``--rdzv-endpoint HOST[:PORT]`` (port 29400 by default, as
    torchrun's; not with ``--standalone``, as under torchrun), else ``--master-addr`` and ``--master-port``."""
    if args.standalone or not args.rdzv_endpoint:
        return args.master_addr, _port(args)
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    try:
        return parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=29400)
    except ValueError as exc:
        raise ConfigError(f"--rdzv-endpoint {args.rdzv_endpoint}: {exc} Give HOST:PORT, e.g. --rdzv-endpoint "
                          "127.0.0.1:29400.") from None


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
