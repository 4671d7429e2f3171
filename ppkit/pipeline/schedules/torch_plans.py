"""The plans torch's schedules make, read without running a step.

A torch schedule computes every rank's order of work when it is built, so building it on stand-in
stages (a tiny ``nn.Linear`` each) gives the plan of any micro-batch count at no cost: the bubble
formulas are checked against these plans, and ppkit's refusals (``placement.check_microbatches``)
against the counts torch itself refuses.

    plans = cluster.run(plans_on_ranks, [("zbvzerobubble", 4), ("dualpipev", 3)])[0]
    plans[("zbvzerobubble", 4)]   # {rank: [Op, ...]}; a count torch refuses maps to its message
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining

from ppkit.pipeline.schedules import placement
from ppkit.pipeline.schedules.plan import plan_of


def build_torch_schedule(schedule: str, rank: int, world_size: int, num_microbatches: int, group):
    """``schedule`` as torch builds it for ``num_microbatches`` on stand-in stages, with no check of
    ppkit's first (so torch's own ``ValueError`` comes through)."""
    spec = placement.spec_of(schedule)
    num_stages = spec.stages_per_rank * world_size
    example = torch.empty(1, 2, device="meta")
    stages = [pipelining.PipelineStage(nn.Linear(2, 2), s, num_stages, torch.device("cpu"),
                                       input_args=example, output_args=example, group=group)
              for s in placement.stages_of_rank(schedule, rank, world_size)]
    torch_class = getattr(pipelining, spec.torch_name)
    loss_fn = nn.functional.mse_loss
    if spec.stages_per_rank == 1:
        return torch_class(stages[0], n_microbatches=num_microbatches, loss_fn=loss_fn)
    return torch_class(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)


def plans_on_ranks(rank: int, world_size: int, cases) -> dict:
    """For each ``(schedule, num_microbatches)`` in ``cases``: the plan torch makes (rank -> ops), or
    the text of the ``ValueError`` torch raises for it. Run it on every rank of a cluster."""
    group = dist.new_group(list(range(world_size)), timeout=timedelta(seconds=30), backend="gloo")
    results = {}
    for schedule, m in cases:
        try:
            results[(schedule, m)] = plan_of(build_torch_schedule(schedule, rank, world_size, m, group))
        except ValueError as exc:
            results[(schedule, m)] = f"{type(exc).__name__}: {exc}"
    dist.barrier(group=group)
    dist.destroy_process_group(group)
    return results
