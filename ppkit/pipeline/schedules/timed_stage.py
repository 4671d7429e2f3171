"""A ``PipelineStage`` that records its work, and the ResNet50 pieces a rank turns into stages.

Every forward (``F``), whole backward (``B``), input-gradient backward (``I``) and weight-gradient
backward (``W``) of a micro-batch is timed, with the stage it ran on, so a rank holding two stages
draws both on one row.
"""

from __future__ import annotations

import functools
import time

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage

from ppkit.models.resnet import resnet50, split_resnet50_at


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that records when each piece of work on a micro-batch ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[tuple[int, str, int, float, float]] = []  # (stage, kind, mb, start, end)

    def _record(self, kind: str, chunk: int, start: float) -> None:
        self.events.append((self.stage_index, kind, chunk, start, time.perf_counter()))

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        start = time.perf_counter()
        out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        self._record("F", fwd_chunk_id, start)
        return out

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        start = time.perf_counter()
        super().backward_one_chunk(bwd_chunk_id, loss=loss, full_backward=full_backward,
                                   last_backward=last_backward)
        self._record("B" if full_backward else "I", bwd_chunk_id, start)

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        start = time.perf_counter()
        super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)
        self._record("W", bwd_chunk_id, start)


def example_tensors(cuts: tuple[str, ...], microbatch_size: int, image_size: int) -> list[torch.Tensor]:
    """Meta tensors of one micro-batch at each stage boundary: [input, activation at each cut, logits].

    A ``PipelineStage`` given these shapes skips its run-time shape inference (an extra forward and
    backward of the first micro-batch). Meta tensors cost no memory and no compute.
    """
    with torch.device("meta"):
        tensors = [torch.empty(microbatch_size, 3, image_size, image_size)]
        for shard in split_resnet50_at(resnet50(), cuts):
            tensors.append(shard.eval()(tensors[-1]))
    # a received activation must require grad, or no gradient flows back to the stage before
    return [tensors[0], *(t.detach().requires_grad_(True) for t in tensors[1:])]


@functools.lru_cache(maxsize=2)
def _eval_shards(cuts: tuple[str, ...], seed: int) -> tuple[nn.Module, ...]:
    """All shards in eval mode, built once per worker (building ResNet50 takes a second); steps
    that change no weights and no BatchNorm statistics can share them."""
    return tuple(shard.eval() for shard in split_resnet50_at(resnet50(seed), cuts))


def shards_for(cuts: tuple[str, ...], seed: int, indices, train_mode: bool, lr: float | None) -> list[nn.Module]:
    """The shards ``indices`` of ``resnet50(seed)`` cut at ``cuts``: shared eval-mode ones, or fresh
    ones for training (``train_mode`` or a learning rate)."""
    if train_mode or lr is not None:
        shards = split_resnet50_at(resnet50(seed), cuts)
        return [shards[i].train(train_mode) for i in indices]
    shards = _eval_shards(cuts, seed)
    return [shards[i] for i in indices]
