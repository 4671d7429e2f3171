"""Check the pipeline against a local torchvision ResNet50 holding the same weights.

In eval mode the two compute the same function; only the order of floating-point sums differs
(convolutions pick algorithms by batch size), so outputs agree to about 1e-5 (measured: up to
~5e-5 with 8+ micro-batches). In train mode they do *not* agree: BatchNorm normalises each
micro-batch with that micro-batch's own mean and variance (see notebook 05).

Shards on CUDA compute in plain float32 during the comparison: by default cuDNN convolutions use
TF32, whose outputs differ from the CPU's by ~1e-2 (measured on an H100: 2.5e-2 with outputs of ~1),
which would hide a pipeline error of that size. Their TF32 setting is restored afterwards.
"""

from __future__ import annotations

import torch
import torch.distributed.rpc as rpc

from ppkit.models.resnet import resnet50, split_resnet50
from ppkit.pipeline.rpc import stages
from ppkit.pipeline.rpc.model import PipelineModel

EVAL_TOLERANCE = 1e-4  # eval mode, relative to the largest output (or 1): measured differences
# stay below 6e-5 with outputs of magnitude ~1-10


def local_copy(model: PipelineModel, into: torch.nn.Module | None = None) -> torch.nn.Module:
    """A local torchvision ResNet50 with the pipeline's current weights (and BN statistics).

    ``into``: load them into this ResNet50 instead of building a new one.
    """
    local = resnet50(model.seed, model.num_classes) if into is None else into
    for shard, state in zip(split_resnet50(local, model.cut), model.state_dicts()):
        shard.load_state_dict(state)
    return local


def compare(model: PipelineModel, batches, microbatch_sizes=None) -> tuple[float, float]:
    """``(largest |pipeline - local|, largest |local|)`` over ``batches`` and micro-batch sizes.

    Eval mode, a local copy with the pipeline's current weights. Restores the pipeline's
    train/eval mode and micro-batch size afterwards.
    """
    local = local_copy(model).eval()
    was_training, size = model.training, model.microbatch_size
    worst, largest = 0.0, 0.0
    cuda_processes = sorted({p.process for p in model.placement if p.device.startswith("cuda")})
    tf32 = {name: rpc.rpc_sync(name, stages.set_tf32, args=(False,)) for name in cuda_processes}
    model.eval()
    try:
        with torch.no_grad():
            for inputs in batches:
                expected = local(inputs)
                largest = max(largest, expected.abs().max().item())
                for microbatch_size in (microbatch_sizes or [size]):
                    model.microbatch_size = microbatch_size
                    worst = max(worst, (model(inputs) - expected).abs().max().item())
    finally:
        model.microbatch_size = size
        model.train(was_training)
        for name, before in tf32.items():
            rpc.rpc_sync(name, stages.restore_tf32, args=(before,))
    return worst, largest


def tolerance(largest_output: float) -> float:
    return EVAL_TOLERANCE * max(1.0, largest_output)
