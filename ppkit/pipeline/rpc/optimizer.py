"""The pipeline's optimizer: one local optimizer per shard, on the shard's own process.

Parameters never leave their process; each stage steps with the gradients that distributed
autograd left there for the step's context.
"""

from __future__ import annotations

import torch

from ppkit.pipeline.rpc import stages
from ppkit.pipeline.rpc.model import PipelineModel


class PipelineOptimizer:
    """One local optimizer per shard, stepped with that shard's distributed gradients.

    This is what the upstream example uses now instead of ``DistributedOptimizer`` (which warns
    that its TorchScript path is deprecated): each stage reads ``dist_autograd.get_gradients``
    and steps its own ``optimizer_class(shard.parameters(), **kwargs)``.
    """

    def __init__(self, model: PipelineModel, optimizer_class=torch.optim.SGD, **kwargs):
        self.model = model
        model.call_stages(stages.make_optimizer, optimizer_class, kwargs, what="creating the optimizer")

    def step(self, context_id: int | None) -> None:
        """Step every shard with its gradients of ``context_id``, or (``None``) with the gradients
        :meth:`accumulate` added up."""
        self.model.call_stages(stages.optimizer_step, context_id, what="optimizer step")

    def accumulate(self, context_id: int) -> None:
        """Add every shard's gradients of ``context_id`` to what the next ``step(None)`` uses."""
        self.model.call_stages(stages.accumulate_gradients, context_id, what="accumulating gradients")
