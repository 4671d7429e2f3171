"""Do the pipelines compute what one local ResNet50 computes? Its loss and gradients, and how
close counts as equal.
"""

from __future__ import annotations

import torch

from ppkit.errors import ConfigError
from ppkit.models.resnet import DEFAULT_CUT, resnet50, split_resnet50_at
from ppkit.pipeline.schedules.stage import LOSSES

# "Equal" for these float32 computations. Convolutions pick their algorithm by batch size, so a
# micro-batch's gradients differ from the whole batch's in the last bits: measured up to 5.6e-5 of
# the largest gradient (64x64 images, micro-batches of 4 against a batch of 16, one thread per
# stage), 3.9e-7 at 32x32; and 2.0e-4 on an AMD EPYC (40x40, micro-batches of 2, cut after layer1:
# with one thread, 1x1 convolutions of fewer than 16 images take torch's native kernel, not oneDNN).
# A real mistake (a missing 1/m, a wrong micro-batch) is off by far more (0.5 and up).
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-3


def reference_step(x: torch.Tensor, y: torch.Tensor, cut=DEFAULT_CUT, seed: int = 0,
                   loss: str = "cross_entropy") -> dict:
    """The same step on one local model (eval-mode BN, whole batch): loss and gradients per shard,
    the model cut at ``cut`` (one cut point, or several: ``("layer1", "layer2", "layer3")``)."""
    model = resnet50(seed).eval()
    loss = LOSSES[loss](model(x), y)
    loss.backward()
    return {"loss": loss.item(),
            "grads": [{name: p.grad for name, p in shard.named_parameters()}
                      for shard in split_resnet50_at(model, cut)]}


def grad_difference(grads: list[dict], reference: list[dict]) -> float:
    """The largest gradient difference, relative to the largest reference gradient (0 = identical)."""
    if len(grads) != len(reference):
        raise ConfigError(f"{len(grads)} stages of gradients against {len(reference)} reference stages.")
    worst = scale = 0.0
    for mine, ref in zip(grads, reference):
        if mine.keys() != ref.keys():
            raise ConfigError("the two gradient sets are for different parameters; compare the same cut.")
        for name, g in ref.items():
            worst = max(worst, (mine[name] - g).abs().max().item())
            scale = max(scale, g.abs().max().item())
    return worst / scale
