"""Which ranks run on which node of a SLURM job: one agent per node forks that node's ranks.

SLURM says how many of a job's tasks each node holds in SLURM_TASKS_PER_NODE ("3,1", "2(x3)");
the ranks follow in node order, as SLURM_PROCID does under its default block distribution. One
``ppkit worker`` per node (not one per task) imports torch once there and forks them all, and each
rank is given the variables ``srun`` would have given that task (``task_env``).
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


def compressed(counts: list[int]) -> str:
    """``[2, 2, 1]`` -> ``"2(x2),1"``: SLURM's own way of writing SLURM_TASKS_PER_NODE."""
    runs: list[list[int]] = []
    for count in counts:
        if runs and runs[-1][0] == count:
            runs[-1][1] += 1
        else:
            runs.append([count, 1])
    return ",".join(f"{count}(x{times})" if times > 1 else str(count) for count, times in runs)


def task_env(counts: list[int], rank: int) -> dict[str, str]:
    """The variables ``srun -n sum(counts)`` gives task ``rank`` when the step's nodes hold ``counts`` tasks each,
    in block order: ``[2, 1]``, rank 2 -> SLURM_NODEID 1, SLURM_LOCALID 0, SLURM_GTIDS "2" (the node's tasks),
    SLURM_TASKS_PER_NODE "2,1". What only the node knows (SLURMD_NODENAME, SLURM_NODELIST, SLURM_CPUS_ON_NODE)
    the rank has from its node's agent, which runs in a step over the same nodes."""
    if not counts or min(counts) < 1 or not 0 <= rank < sum(counts):
        raise ConfigError(f"rank {rank} has no place in a layout of {counts} task(s) per node: every node of a "
                          "SLURM step holds a task, and ranks run from 0 to the number of tasks less one.")
    node = next(i for i in range(len(counts)) if rank < sum(counts[:i + 1]))
    first, ntasks, nnodes, tasks = sum(counts[:node]), str(sum(counts)), str(len(counts)), compressed(counts)
    return {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(rank - first),
            "SLURM_GTIDS": ",".join(map(str, range(first, first + counts[node]))),
            "SLURM_NTASKS": ntasks, "SLURM_NPROCS": ntasks, "SLURM_STEP_NUM_TASKS": ntasks,
            "SLURM_NNODES": nnodes, "SLURM_STEP_NUM_NODES": nnodes,
            "SLURM_TASKS_PER_NODE": tasks, "SLURM_STEP_TASKS_PER_NODE": tasks, "SLURM_DISTRIBUTION": "block"}


def settle(world_size: int, guess: list[tuple[int, ...]], said: dict[int, tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each node's ranks once the agents of some nodes have said theirs (``said``, by node): theirs as said, and
    the ranks between them shared in block order by the nodes yet to say, so that every rank has exactly one
    node at every moment (a rank claimed by two nodes was told the wrong SLURM_NODEID). ``guess`` (each node's
    ranks until now) stands where what was said does not fit together, which SLURM's block layout never does."""
    placed: list[tuple[int, ...] | None] = [said.get(i) for i in range(len(guess))]
    start = 0
    while start < len(placed):
        end = start
        while end < len(placed) and placed[end] is None:
            end += 1
        if end > start:  # nodes start..end-1 have not said: they hold what lies between their neighbours
            low = placed[start - 1][-1] + 1 if start else 0
            high = placed[end][0] if end < len(placed) else world_size
            if high - low < end - start:
                return guess
            for i, count in enumerate(tasks_per_node(even(high - low, end - start)), start):
                placed[i], low = tuple(range(low, low + count)), low + count
        start = end + 1
    ranks = [rank for node in placed for rank in node]
    return placed if ranks == list(range(world_size)) else guess
