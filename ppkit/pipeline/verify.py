"""Check the pipeline against a local torchvision ResNet50 holding the same weights.

In eval mode the two compute the same function; only the order of floating-point sums differs
(convolutions pick algorithms by batch size), so outputs agree to about 1e-5 (measured: up to
~5e-5 with 8+ micro-batches). In train mode they do *not* agree: BatchNorm normalises each
micro-batch with that micro-batch's own mean and variance (see notebook 05).
"""

from __future__ import annotations

import torch

from ppkit.models.resnet import resnet50, split_resnet50
from ppkit.pipeline.model import PipelineModel

EVAL_ATOL = 1e-4  # eval-mode outputs, any micro-batch size; measured differences stay below 6e-5


def local_copy(model: PipelineModel) -> torch.nn.Module:
    """A local torchvision ResNet50 with the pipeline's current weights (and BN statistics)."""
    local = resnet50(model.seed, model.num_classes)
    for shard, state in zip(split_resnet50(local, model.cut), model.state_dicts()):
        shard.load_state_dict(state)
    return local


def max_abs_diff(model: PipelineModel, batches, microbatch_sizes=None) -> float:
    """Largest |pipeline - local| over ``batches`` (inputs) and micro-batch sizes, in eval mode.

    Restores the pipeline's train/eval mode and micro-batch size afterwards.
    """
    local = local_copy(model).eval()
    was_training, size = model.training, model.microbatch_size
    worst = 0.0
    model.eval()
    try:
        with torch.no_grad():
            for inputs in batches:
                expected = local(inputs)
                for microbatch_size in (microbatch_sizes or [size]):
                    model.microbatch_size = microbatch_size
                    worst = max(worst, (model(inputs) - expected).abs().max().item())
    finally:
        model.microbatch_size = size
        model.train(was_training)
    return worst
