"""What ``launcher="slurm"`` takes: nodes, partition, a time limit and extra sbatch flags."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ppkit.errors import ConfigError

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")
_PARTITION = re.compile(r"[A-Za-z0-9_.,-]+")
DEFAULT_TIME = "00:30:00"
OWN_FLAGS = ("--nodes", "-N", "--ntasks", "-n", "--time", "-t", "--partition", "-p", "--output", "-o",
             "--job-name", "-J", "--parsable")


@dataclass(frozen=True)
class SlurmOptions:
    """What the SLURM launcher asks of the cluster (part of a ClusterSpec)."""
    nodes: int = 1
    partition: str | None = None
    time: str = DEFAULT_TIME
    sbatch_args: tuple[str, ...] = ()
    # the same number of ranks on every node, as torchrun's --nproc-per-node places them (%%torchrun
    # --nnodes sets it); None: as SLURM spreads them
    ntasks_per_node: int | None = None


def check_slurm_options(nodes=None, partition=None, time=None, sbatch_args=(), need_tools=True) -> SlurmOptions:
    """The checked options (``need_tools``: SLURM's commands must be on PATH, as a launch needs)."""
    from ppkit.cluster.slurm.commands import require_tools

    nodes = 1 if nodes is None else nodes
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"nodes must be a whole number of SLURM nodes, 1 or more (e.g. nodes=2), got {nodes!r}.")
    if partition is not None and (not isinstance(partition, str) or not _PARTITION.fullmatch(partition)):
        raise ConfigError(f"partition must be a SLURM partition's name such as 'debug' (`sinfo -s` lists "
                          f"them), or None for the cluster's default, got {partition!r}.")
    time = DEFAULT_TIME if time is None else time
    if not isinstance(time, str) or not _TIME.fullmatch(time.strip()):
        raise ConfigError(
            f"time must be a SLURM time limit such as '00:30:00' (hours:minutes:seconds), '45' (minutes) or "
            f"'1-00:00:00' (days-hours:minutes:seconds), got {time!r}.")
    if isinstance(sbatch_args, str) or not all(isinstance(a, str) for a in sbatch_args):
        raise ConfigError(f"sbatch_args must be a list of strings, one flag each, e.g. ['--account=course', "
                          f"'--qos=debug'], got {sbatch_args!r}.")
    taken = [a for a in sbatch_args if a.split("=")[0] in OWN_FLAGS]
    if taken:
        raise ConfigError(
            f"sbatch_args {taken} set what ppkit sets from its own options (nodes=, partition=, time=, the "
            "number of ranks, the output file). Use those options instead.")
    if need_tools:
        require_tools()
    return SlurmOptions(nodes=nodes, partition=partition, time=time.strip(), sbatch_args=tuple(sbatch_args))


def allocation_nodes(nodes, world_size: int, environ=os.environ):
    """Inside an allocation (salloc, Open OnDemand): the nodes a step of ``world_size`` tasks spans, as
    ``srun -n world_size`` there would: every node of the allocation (at most one a task) when ``nodes``
    is None. ``nodes=`` beyond the allocation is refused at once, with both numbers. Outside one: ``nodes``."""
    from ppkit.cluster.slurm.commands import inside_allocation

    job = inside_allocation(environ)
    count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES")
    if job is None or not (count or "").isdigit():
        return nodes
    have = int(count)
    if nodes is None:
        return min(have, world_size)
    if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > have:
        raise ConfigError(
            f"nodes={nodes} is more than the {have} node(s) of your allocation {job}: this notebook runs inside "
            f"it (SLURM_JOB_ID={job}), so its ranks are a step of it and cannot leave it. Leave nodes= out to use "
            f"all {have}, or ask for a new allocation of {nodes} nodes (salloc -N {nodes}, or Open OnDemand's "
            "form) and start the notebook there.")
    return nodes
