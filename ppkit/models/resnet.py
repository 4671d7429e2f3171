"""torchvision's ResNet50 cut into two shards at a stage boundary.

The shards are plain ``nn.Sequential`` slices of one ``torchvision.models.resnet50``, so running
shard 2 on shard 1's output is exactly the whole model: tests and notebooks compare against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used, so the CLI can read CUT_POINTS quickly
    from torch import nn

from ppkit.errors import ConfigError

# The stages of torchvision's ResNet in forward order; a cut "after X" ends shard 1 with X.
STAGES = ("stem", "layer1", "layer2", "layer3", "layer4")
CUT_POINTS = STAGES[:-1]  # cutting after layer4 would leave only pooling and fc in shard 2
DEFAULT_CUT = "layer2"  # the tutorial's split: shard 1 = stem + layer1 + layer2


def check_cut(cut: str) -> str:
    if cut not in CUT_POINTS:
        raise ConfigError(
            f"unknown cut point {cut!r}. ResNet50 can be cut after one of {', '.join(CUT_POINTS)} "
            f"(shard 1 ends with that stage; '{DEFAULT_CUT}' is the tutorial's split).")
    return cut


def resnet50(seed: int = 0, num_classes: int = 1000) -> nn.Module:
    """A torchvision ResNet50 with deterministic random weights (no download)."""
    import torch
    from torchvision.models import resnet50 as tv_resnet50

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return tv_resnet50(weights=None, num_classes=num_classes)


def stage_modules(model: nn.Module) -> dict[str, nn.Module]:
    from torch import nn

    return {
        "stem": nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool),
        "layer1": model.layer1,
        "layer2": model.layer2,
        "layer3": model.layer3,
        "layer4": model.layer4,
    }


def split_resnet50(model: nn.Module, cut: str = DEFAULT_CUT) -> tuple[nn.Sequential, nn.Sequential]:
    """Split ``model`` after stage ``cut``; the shards share the model's parameters."""
    from torch import nn

    check_cut(cut)
    stages = stage_modules(model)
    end = STAGES.index(cut) + 1
    shard1 = nn.Sequential(*(stages[name] for name in STAGES[:end]))
    shard2 = nn.Sequential(*(stages[name] for name in STAGES[end:]),
                           model.avgpool, nn.Flatten(1), model.fc)
    return shard1, shard2


def build_shards(cut: str = DEFAULT_CUT, seed: int = 0) -> tuple[nn.Sequential, nn.Sequential]:
    """The two shards of ``resnet50(seed)`` cut after ``cut``, as independent copies."""
    return split_resnet50(resnet50(seed), cut)
