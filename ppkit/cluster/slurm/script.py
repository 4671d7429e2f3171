"""What ppkit submits to SLURM, as text a learner can read (``cluster.slurm_script``), and the
script ``ppkit slurm-script`` writes for a program of one's own (seed 002's pattern)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

JOB_NAME = "ppkit"
OUTPUT_DIR = Path.home() / ".cache" / "ppkit" / "slurm"  # on the shared home, as the nodes see it


def worker_command(connect: str, timeout: float, python: str = sys.executable) -> list[str]:
    """Each node's agent: join the notebook at ``connect`` as ``node<SLURM_NODEID>`` (one task per node)."""
    return [python, "-m", "ppkit", "worker", "--connect", connect, "--name", "node{rank}",
            "--timeout", f"{timeout:g}"]


def directives(options, tasks: str, output: str | None = None, job_name: str = JOB_NAME) -> list[str]:
    """The #SBATCH lines for ``options`` (a SlurmOptions) and ``tasks`` ("--ntasks=4")."""
    lines = [f"--job-name={job_name}", f"--nodes={options.nodes}", tasks, f"--time={options.time}"]
    if options.partition:
        lines.append(f"--partition={options.partition}")
    if output:
        lines.append(f"--output={output}")
    return [f"#SBATCH {line}" for line in [*lines, *options.sbatch_args]]


def batch_script(options, ntasks: int, command: list[str], output: str) -> str:
    """The batch script of a ppkit cluster: one srun step whose tasks are ppkit's agents."""
    return "\n".join([
        "#!/bin/bash",
        *directives(options, f"--ntasks={ntasks}", output),
        *([f"#SBATCH --ntasks-per-node={options.ntasks_per_node}"] if options.ntasks_per_node else []),
        "#SBATCH --no-requeue",
        "# ppkit's workers: one agent per node (it imports torch once there) joins the notebook over ppkit's",
        "# authenticated channel and forks the ranks SLURM placed on its node (PPKIT_TASKS_PER_NODE), in node",
        "# order as SLURM_PROCID numbers them; the key travels in the job's environment (PPKIT_KEY), not here.",
        "# An agent that fails ends the others (--kill-on-bad-exit); the notebook cancels the job on close.",
        "export PPKIT_TASKS_PER_NODE=\"$SLURM_TASKS_PER_NODE\"",
        f"srun --whole --nodes={options.nodes} --ntasks={options.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 "
        f"{shlex.join(command)}",
        ""])


def srun_command(options, ntasks: int, job_id: str, command: list[str]) -> list[str]:
    """Inside an allocation: a step of it beside the notebook's own (``--overlap``); each node's agent and the
    ranks it forks share what the allocation holds there (``--whole``), as the batch script's step does."""
    return ["srun", "--overlap", "--whole", f"--jobid={job_id}", f"--nodes={options.nodes}",
            f"--ntasks={options.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1", f"--job-name={JOB_NAME}",
            *options.sbatch_args, *command]


def job_name(program: list[str]) -> str:
    """train.py -> train; -m ppkit.lessons.seed002 -> seed002."""
    first = next((p for p in program if not p.startswith("-")), "train")
    name = Path(first).name
    return (name[:-3] if name.endswith(".py") else name.split(".")[-1]) or "train"


def training_script(program: list[str], options, ntasks_per_node: int, master_port: int = 29500,
                    python: str = sys.executable) -> str:
    """An sbatch script for seed 002's pattern: ``srun`` starts ``program`` once per task, and each
    task reads who it is with ``ppkit.read_launch_env()`` (rank = SLURM_PROCID, local rank =
    SLURM_LOCALID); MASTER_ADDR is the first node, resolved as SLURM's tools do."""
    return "\n".join([
        "#!/bin/bash",
        *directives(options, f"--ntasks-per-node={ntasks_per_node}", output="%x-%j.out",
                    job_name=job_name(program)),
        "# rank 0's node hosts the rendezvous: its name, or SLURM's NodeAddr where the name does not resolve",
        f"export MASTER_ADDR=$({shlex.quote(python)} -m ppkit.cluster.slurm.hosts \"$SLURM_JOB_NODELIST\")",
        f"export MASTER_PORT={master_port}",
        f"srun {shlex.join([python, *program])}",
        ""])
