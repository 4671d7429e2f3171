"""What notebook 05 measures: what each cut leaves on either side, and what micro-batches do to
train-mode BatchNorm."""

from __future__ import annotations

import torch

from ppkit.models.resnet import CUT_POINTS, resnet50, split_resnet50
from ppkit.pipeline.rpc.config import num_microbatches
from ppkit.pipeline.rpc.model import PipelineModel
from ppkit.pipeline.rpc.verify import local_copy


def describe_cuts(image_size: int = 64, model: torch.nn.Module | None = None) -> list[dict]:
    """Per cut point: parameters in each shard, and the activation one image sends between them.

    ``model``: the ResNet50 to cut (default: a new ``resnet50(0)``).
    """
    rows = []
    model = (resnet50(0) if model is None else model).eval()
    x = torch.zeros(1, 3, image_size, image_size)
    for cut in CUT_POINTS:
        first, second = split_resnet50(model, cut)
        with torch.no_grad():
            activation = first(x)
        rows.append({
            "cut": cut,
            "shard1_params_M": round(sum(p.numel() for p in first.parameters()) / 1e6, 2),
            "shard2_params_M": round(sum(p.numel() for p in second.parameters()) / 1e6, 2),
            "activation_shape": tuple(activation.shape[1:]),
            "activation_kB_per_image": round(activation.numel() * activation.element_size() / 1024, 1),
        })
    return rows


def train_mode_gap(model: PipelineModel, x: torch.Tensor, microbatch_sizes,
                   local: torch.nn.Module | None = None) -> list[dict]:
    """How far train-mode outputs move when the batch is cut into micro-batches.

    For each size: the largest difference between the pipeline (train mode) and a local copy run
    on the whole batch at once, relative to the largest output; and the largest difference to the
    local copy run *one micro-batch at a time*, which is what the pipeline computes (so that one is
    float noise). Train-mode forwards update BatchNorm's running statistics on the pipeline: run
    this after the eval-mode checks. ``local``: a ResNet50 to load the pipeline's weights into
    (default: a new one).
    """
    local = local_copy(model, into=local).train()
    was_training, size = model.training, model.microbatch_size
    rows = []
    model.train()
    try:
        with torch.no_grad():
            whole = local(x)
            for microbatch_size in microbatch_sizes:
                model.microbatch_size = microbatch_size
                out = model(x)
                per_microbatch = torch.cat([local(chunk) for chunk in x.split(microbatch_size)])
                gap = (out - whole).abs().max().item()
                rows.append({
                    "microbatch_size": microbatch_size,
                    "num_microbatches": num_microbatches(len(x), microbatch_size),
                    "max_diff_vs_whole_batch": gap,
                    "relative_to_largest_output": gap / whole.abs().max().item(),
                    "max_diff_vs_local_per_microbatch": (out - per_microbatch).abs().max().item(),
                })
    finally:
        model.microbatch_size = size
        model.train(was_training)
    return rows
