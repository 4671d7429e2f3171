"""Lesson 14, measured: tokens per second and MFU of the capstone's training step on each mesh (08c's formulas).

    step_flops    the model FLOPs of one step: (6 N + 12 L s d) per token (lesson 08c: Kaplan's 6N, PaLM's attention)
    Speed         one mesh's step: seconds (median of the timed steps, slowest rank), tokens/s, MFU
    measure       each mesh trained for ``warmup`` + ``steps`` steps on the cluster, the timed steps' median
    machine_peak  lesson 08c's achievable fp32 matmul rate of one core, times the cores the ranks share (the
                  learner's CPU budget: a hub's quota or CPU_LIMIT, not every core the machine has)

MFU here is the model's FLOPs per second over the whole machine's peak (every core the ranks share), since all
ranks of a mesh run on the same cores: one number per mesh, comparable between meshes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ppkit.cluster.budget import read_budget
from ppkit.lessons import capstone as cap
from ppkit.lessons import step_flops as sf
from ppkit.models import llama


def step_flops(run: cap.Run = cap.RUN) -> int:
    """Model FLOPs of one training step (forward and backward) on ``run.tokens`` tokens."""
    c = run.config
    return (6 * llama.matmul_params(c) + 12 * c.layers * c.seq * c.dim) * run.tokens


def machine_peak(cores: float | None = None) -> float:
    """FLOPs per second the ranks can reach: one thread's best fp32 matmul (08c) times ``cores`` (default: the CPU
    budget, ``ppkit.cluster.budget.read_budget``: a cgroup quota, the hub's CPU_LIMIT, the cores this process may
    run on, whichever is fewest; ``os.cpu_count()`` would count a whole shared server's cores)."""
    return sf.measure_peak(512, 5).flops_per_s * (cores or read_budget().cores)


@dataclass(frozen=True)
class Speed:
    mesh: tuple[int, int, int]
    step_s: float
    tokens_per_s: float
    mfu: float
    losses: tuple[float, ...]


def measure(cluster, meshes, peak_flops_per_s: float, run: cap.Run = cap.RUN, steps: int = 3, warmup: int = 1,
            timeout: float = 600) -> list[Speed]:
    """Each mesh (on the cluster's first dp x pp x tp ranks) for ``warmup`` + ``steps`` steps; a step's time is
    the slowest rank's, and the median of the timed steps counts (the first builds DTensor's sharding caches)."""
    out = []
    for mesh in meshes:
        ranks = mesh[0] * mesh[1] * mesh[2]
        cap.check_mesh(ranks, mesh, run)
        results = cluster.run(cap.train, mesh=tuple(mesh), run=run, steps=warmup + steps, ranks=ranks,
                              timeout=timeout)
        slowest = [max(r["seconds"][i] for r in results if r is not None) for i in range(warmup, warmup + steps)]
        step_s = statistics.median(slowest)
        out.append(Speed(tuple(mesh), step_s, run.tokens / step_s, step_flops(run) / step_s / peak_flops_per_s,
                         tuple(cap.combine(results))))
    return out
