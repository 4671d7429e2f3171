"""torchvision's ResNet50 cut into shards at stage boundaries (two for most lessons, four for the
interleaved and V-shaped pipeline schedules).

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
    shard1, shard2 = split_resnet50_at(model, (cut,))
    return shard1, shard2


def check_cuts(cuts) -> tuple[str, ...]:
    """``cuts`` as a tuple of distinct cut points in forward order (one cut: two shards)."""
    cuts = (cuts,) if isinstance(cuts, str) else tuple(cuts)
    for cut in cuts:
        check_cut(cut)
    if not cuts or list(cuts) != sorted(set(cuts), key=STAGES.index):
        raise ConfigError(f"cut points {list(cuts)} must be distinct and in forward order "
                          f"({', '.join(CUT_POINTS)}), e.g. ('layer1', 'layer2', 'layer3') for four shards.")
    return cuts


def split_resnet50_at(model: nn.Module, cuts) -> tuple[nn.Sequential, ...]:
    """Split ``model`` after each stage in ``cuts`` (``len(cuts) + 1`` shards sharing its parameters)."""
    from torch import nn

    stages = stage_modules(model)
    ends = [STAGES.index(cut) + 1 for cut in check_cuts(cuts)]
    names = [STAGES[a:b] for a, b in zip([0, *ends], [*ends, len(STAGES)])]
    shards = [nn.Sequential(*(stages[name] for name in group)) for group in names]
    shards[-1].extend([model.avgpool, nn.Flatten(1), model.fc])
    return tuple(shards)
