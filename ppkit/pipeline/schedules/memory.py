"""How many bytes of activations a stage keeps for its backward, now and at the peak.

On a GPU, ``torch.cuda.max_memory_allocated`` answers this (plus everything else on the device). On
CPU there is no such counter, and the process's RSS mixes in the allocator's caching, so this
meter counts what autograd itself keeps: every tensor a forward saves for its backward (through
``torch.autograd.graph.saved_tensors_hooks``), once per memory region, until autograd frees it.
"""

from __future__ import annotations

import torch
from torch import nn


class ActivationMeter:
    """Bytes of tensors autograd keeps for backward (activations), live now and at the peak.

    >>> meter = ActivationMeter(model)
    >>> with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
    ...     loss = model(x).sum()
    >>> meter.current, meter.peak          # bytes held for the backward

    Parameters and buffers of ``module`` are not counted: they are there whatever the schedule.
    """

    def __init__(self, module: nn.Module):
        self._exclude = {t.data_ptr() for t in [*module.parameters(), *module.buffers()]}
        self._live: dict[tuple, list[int]] = {}  # memory region -> [saves alive, bytes]
        self.current = 0
        self.peak = 0

    def reset_peak(self) -> None:
        self.peak = self.current

    def pack(self, tensor: torch.Tensor):
        if tensor.data_ptr() in self._exclude:
            return tensor
        return _Saved(self, tensor)

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _add(self, key: tuple, nbytes: int) -> None:
        entry = self._live.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        entry[0] += 1

    def _remove(self, key: tuple) -> None:
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self._live[key]


class _Saved:
    """What autograd stores instead of a saved tensor; deleted when autograd lets go of it."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, meter: ActivationMeter, tensor: torch.Tensor):
        self.meter, self.tensor = meter, tensor
        # a region, not a storage: micro-batches that are views of one batch count separately
        self.key = (tensor.data_ptr(), tensor.numel(), tensor.element_size())
        meter._add(self.key, tensor.numel() * tensor.element_size())

    def __del__(self):
        self.meter._remove(self.key)
