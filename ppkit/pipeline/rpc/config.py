"""What a pipeline run is made of, checked before anything starts.

Two levels of checks, both raising :class:`ppkit.ConfigError`:

- :meth:`PipelineConfig.check` needs nothing running: sizes, the cut point, the placement's syntax,
  and whether train-mode BatchNorm would see a single value per channel;
- :func:`check_placement` asks the RPC world: do the named processes exist, and does each one
  have the device it is asked to use (``cuda:3`` on a CPU machine is refused here, not later).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from ppkit.errors import ConfigError
from ppkit.models.resnet import CUT_POINTS, DEFAULT_CUT, check_cut

MASTER = "master"
AUTO_CUT = "auto"  # measure every cut on this machine and take the most balanced (balance.py)
_PROCESS = re.compile(r"^(master|worker[1-9][0-9]*)$")
_DEVICE = re.compile(r"^(cpu|cuda(:[0-9]+)?)$")


@dataclass(frozen=True)
class Placement:
    """Where one shard lives: an RPC process name and a torch device on that process."""

    process: str
    device: str = "cpu"

    def __str__(self) -> str:
        return f"{self.process}:{self.device}"


def parse_placement(text: str | list | tuple) -> tuple[Placement, ...]:
    """``"master:cpu,worker1:cuda:0"`` -> one :class:`Placement` per shard, in order.

    Also accepts a list of strings, ``Placement`` objects or ``(process, device)`` pairs.
    """
    if isinstance(text, str):
        items = [part.strip() for part in text.split(",")]
    else:
        items = list(text)
    placements = []
    for item in items:
        if isinstance(item, Placement):
            placements.append(item)
            continue
        if isinstance(item, (tuple, list)) and len(item) == 2:
            process, device = item
        elif isinstance(item, str) and item:
            process, _, device = item.partition(":")
            device = device or "cpu"
        else:
            raise ConfigError(f"cannot read placement {item!r}: write NAME:DEVICE, e.g. worker1:cpu.")
        placements.append(Placement(str(process).strip(), _normalise_device(str(device).strip(), item)))
    for placement in placements:
        if not _PROCESS.match(placement.process):
            raise ConfigError(
                f"unknown process {placement.process!r} in placement {item_list(placements)}: "
                "name 'master' (this process) or 'workerN' (N = 1, 2, ...).")
    return tuple(placements)


def item_list(placements) -> str:
    return ",".join(str(p) for p in placements)


def _normalise_device(device: str, item) -> str:
    if not _DEVICE.match(device):
        raise ConfigError(
            f"unknown device {device!r} in placement {item!r}: use cpu or cuda:N (N = 0, 1, ...).")
    return "cuda:0" if device == "cuda" else device


def num_microbatches(batch_size: int, microbatch_size: int) -> int:
    """How many micro-batches ``microbatch_size`` cuts a batch into (the last may be smaller)."""
    return math.ceil(batch_size / microbatch_size)


def check_microbatch_size(microbatch_size, batch_size: int) -> int:
    if isinstance(microbatch_size, bool) or not isinstance(microbatch_size, int):
        raise ConfigError(f"micro-batch size must be a whole number, got {microbatch_size!r}.")
    if not 1 <= microbatch_size <= batch_size:
        raise ConfigError(
            f"micro-batch size {microbatch_size} does not fit a batch of {batch_size}: choose 1 to "
            f"{batch_size} images per micro-batch (1 gives {batch_size} micro-batches, {batch_size} "
            "gives one).")
    return microbatch_size


def resnet_feature_size(image_size: int) -> int:
    """Side of ResNet50's last feature map (layer4) for a square ``image_size`` input."""
    def down(side, kernel, stride, padding):
        return (side + 2 * padding - kernel) // stride + 1

    side = down(down(image_size, 7, 2, 3), 3, 2, 1)  # conv1, maxpool
    for _ in range(3):  # layer2..layer4 halve it with a 3x3 stride-2 convolution
        side = down(side, 3, 2, 1)
    return side


@dataclass(frozen=True)
class PipelineConfig:
    """One experiment: the tutorial's knobs, named for what they are.

    ``microbatch_sizes`` are sizes (images per micro-batch), not counts; the number of
    micro-batches is ``ceil(batch_size / microbatch_size)``.
    """

    batch_size: int = 32
    image_size: int = 64
    num_batches: int = 3
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    placement: tuple[Placement, ...] = field(
        default_factory=lambda: parse_placement("worker1:cpu,worker2:cpu"))
    cut: str = DEFAULT_CUT
    seed: int = 0
    num_classes: int = 1000
    train_mode: bool = True  # BatchNorm in train mode, as the tutorial trains
    # each stage process's share of the cores: "auto", "off" or threads per stage (resources.py)
    stage_threads: str | int = "auto"

    def __post_init__(self):
        sizes = self.microbatch_sizes
        if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
            raise ConfigError(
                f"microbatch_sizes is a list of sizes to try, got {sizes!r}: write microbatch_sizes=({sizes!r},) "
                "for one size, or e.g. microbatch_sizes=(1, 2, 4, 8) for a sweep.")
        object.__setattr__(self, "microbatch_sizes", tuple(sizes))
        if not all(isinstance(p, Placement) for p in self.placement):
            object.__setattr__(self, "placement", parse_placement(self.placement))

    def replace(self, **changes) -> "PipelineConfig":
        return replace(self, **changes)

    def check(self) -> "PipelineConfig":
        """Raise ConfigError for anything that can be known wrong without running."""
        for name in ("batch_size", "image_size", "num_batches", "num_classes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}.")
        if not self.microbatch_sizes:
            raise ConfigError("give at least one micro-batch size.")
        for size in self.microbatch_sizes:
            check_microbatch_size(size, self.batch_size)
        if self.cut != AUTO_CUT:
            check_cut(self.cut)
        from ppkit.pipeline.rpc.resources import check_stage_threads

        object.__setattr__(self, "stage_threads", check_stage_threads(self.stage_threads))
        if len(self.placement) != 2:
            raise ConfigError(
                f"ResNet50 is cut into 2 shards, but the placement names {len(self.placement)} "
                f"({item_list(self.placement)}): give one NAME:DEVICE per shard, e.g. "
                "worker1:cpu,worker2:cpu.")
        if self.train_mode:
            self._check_batchnorm()
        return self

    def _check_batchnorm(self) -> None:
        side = resnet_feature_size(self.image_size)
        for size in self.microbatch_sizes:
            smallest = self.batch_size % size or size
            if smallest * side * side < 2:
                raise ConfigError(
                    f"with {self.image_size}x{self.image_size} images ResNet50's last feature map is "
                    f"{side}x{side}, so a micro-batch of {smallest} image gives train-mode BatchNorm "
                    "one value per channel and it cannot compute a variance. Use images of at least "
                    "33x33 or micro-batches of 2 or more images.")

    def processes(self) -> list[str]:
        """The distinct RPC names the placement uses, in order."""
        return list(dict.fromkeys(p.process for p in self.placement))

    def num_workers(self) -> int:
        """How many workers a world needs for this placement (worker3 needs 3)."""
        numbers = [int(p.process[len("worker"):]) for p in self.placement if p.process != MASTER]
        return max(numbers, default=0)


def check_placement(placement, names, devices: dict[str, int] | None = None) -> None:
    """Check ``placement`` against a running world.

    ``names`` are the RPC names in the world; ``devices`` maps each placement's process to how many
    CUDA devices it has (from :func:`ppkit.pipeline.rpc.stages.probe`); ``None`` checks names only.
    """
    names = list(names)
    for p in placement:
        if p.process not in names:
            raise ConfigError(
                f"placement {p} names {p.process!r}, which is not in this RPC world "
                f"({', '.join(names)}). Start more workers (ppkit.start_rpc(num_workers=N)) or pick "
                "one of those names.")
    for p in placement:
        if devices is not None and p.device.startswith("cuda"):
            index = int(p.device.split(":")[1])
            count = devices.get(p.process, 0)
            if index >= count:
                have = "no CUDA device" if count == 0 else f"cuda:0..cuda:{count - 1}"
                raise ConfigError(
                    f"placement {p} asks for {p.device}, but {p.process} has {have}. Use cpu"
                    + ("" if count == 0 else f" or cuda:0..cuda:{count - 1}") + ".")


__all__ = [
    "AUTO_CUT",
    "CUT_POINTS",
    "MASTER",
    "PipelineConfig",
    "Placement",
    "check_microbatch_size",
    "check_placement",
    "num_microbatches",
    "parse_placement",
    "resnet_feature_size",
]
