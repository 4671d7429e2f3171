"""Which ranks run on which node of a SLURM job: one agent per node forks that node's ranks.

SLURM says how many of a job's tasks each node holds in SLURM_TASKS_PER_NODE ("3,1", "2(x3)");
the ranks follow in node order, as SLURM_PROCID does under its default block distribution. One
``ppkit worker`` per node (not one per task) imports torch once there and forks them all.
"""

from __future__ import annotations

import re

from ppkit.errors import ConfigError

TASKS_ENV = "PPKIT_TASKS_PER_NODE"  # the job's SLURM_TASKS_PER_NODE, handed to each node's agent
_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (SLURM's compressed form)."""
    counts: list[int] = []
    for item in text.strip().split(","):
        match = _ITEM.fullmatch(item.strip())
        if not match:
            raise ConfigError(f"{TASKS_ENV}={text!r} is not in SLURM_TASKS_PER_NODE's form, e.g. '3,1' or '2(x2)'.")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def node_ranks(text: str, node: int) -> list[int]:
    """The ranks node ``node`` (SLURM_NODEID) holds."""
    counts = tasks_per_node(text)
    if not 0 <= node < len(counts):
        raise ConfigError(f"node {node} is not one of the {len(counts)} node(s) of {TASKS_ENV}={text!r}.")
    first = sum(counts[:node])
    return list(range(first, first + counts[node]))


def even(world_size: int, nodes: int) -> str:
    """``world_size`` ranks over ``nodes`` nodes in SLURM's block form (the first get the extra)."""
    base, extra = divmod(world_size, nodes)
    return ",".join(str(base + (i < extra)) for i in range(nodes))


def like_srun(world_size: int, cpus_per_node: list[int]) -> str:
    """What ``srun -n world_size`` would give each node of an allocation whose nodes hold ``cpus_per_node``
    CPUs (SLURM_JOB_CPUS_PER_NODE): SLURM's block layout deals the tasks out a node at a time, each node
    taking one while it has a CPU left, then (past the CPUs, as --overcommit) one each round again.
    ``[3, 1]``, 4 tasks -> ``"3,1"``; ``[4, 4]``, 4 -> ``"2,2"``; ``[3, 1]``, 3 -> ``"2,1"``."""
    nodes = min(len(cpus_per_node), world_size)
    counts, cpus = [0] * nodes, cpus_per_node[:nodes]
    for pass_over_cpus in (True, False):
        while sum(counts) < world_size:
            dealt = 0
            for i in range(nodes):
                if sum(counts) < world_size and (counts[i] < cpus[i] or not pass_over_cpus):
                    counts[i] += 1
                    dealt += 1
            if not dealt:
                break
    return ",".join(map(str, counts))
