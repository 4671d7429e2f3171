"""``ppkit slurm-script``: write the sbatch script for seed 002's pattern (srun starts your program
once per task; each task reads who it is with ``ppkit.read_launch_env()``)."""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "write an sbatch script that runs PROGRAM once per SLURM task (seed 002's srun pattern)"


def add_arguments(parser) -> None:
    parser.add_argument("program", nargs="+", metavar="PROGRAM",
                        help="what each task runs after `python`, e.g. train.py --epochs 3, or "
                             "-m ppkit.lessons.seed002 (put -- before arguments that start with -)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes (default %(default)s)")
    parser.add_argument("--ntasks-per-node", type=int, default=2, metavar="N",
                        help="tasks (ranks) per node; on GPUs, one per GPU (default %(default)s)")
    parser.add_argument("--time", default="00:10:00", help="time limit (default %(default)s)")
    parser.add_argument("--partition", default=None, help="partition (default: the cluster's default)")
    parser.add_argument("--port", type=int, default=29500, help="MASTER_PORT (default %(default)s)")
    parser.add_argument("--sbatch-arg", action="append", default=[], metavar="FLAG",
                        help="another #SBATCH line, e.g. --sbatch-arg=--account=course (repeatable)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the script there (default: print it)")
    parser.epilog = "Submit it with: sbatch FILE. The job's output goes to <program>-<jobid>.out."


def main(args) -> int:
    from ppkit.checks import check_port
    from ppkit.cluster.slurm.options import check_slurm_options
    from ppkit.cluster.slurm.script import training_script
    from ppkit.errors import ConfigError

    if args.ntasks_per_node < 1:
        raise ConfigError(f"--ntasks-per-node must be 1 or more, got {args.ntasks_per_node}.")
    check_port(args.port, "--port")
    options = check_slurm_options(args.nodes, args.partition, args.time, tuple(args.sbatch_arg), need_tools=False)
    text = training_script(list(args.program), options, args.ntasks_per_node, args.port)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}; submit it with: sbatch {args.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0
