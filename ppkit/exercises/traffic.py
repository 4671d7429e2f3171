"""What a learner's function sent: each collective it called, and the bytes a ring sends for it per rank.

    with Traffic(world_size) as seen:
        fn(...)
    seen.calls        # [("all_reduce", 288), ...]: each collective and the bytes of its full tensor
    seen.sent()       # bytes this rank sends for all of them, as a ring algorithm sends them

The calls are seen below torch.distributed's Python functions, where they reach c10d's operators (a
``TorchDispatchMode``, as torch's own ``CommDebugMode`` counts them): ``dist.all_reduce``, ``from
torch.distributed import all_reduce``, an ``async_op=True`` call and the list and tensor forms are all
seen, however the learner imported them. Point-to-point calls (send, recv) are not counted here, and no checker
of send/recv exercises runs under this mode: a rank blocked in a recv inside it was not interrupted when another
rank raised (the job ended in a timeout instead of the other rank's error), as it is without the mode.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# c10d's operator -> the name a learner calls it by
NAMES = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
         "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter_tensor",
         "allgather_": "all_gather", "_allgather_base_": "all_gather_into_tensor",
         "allgather_into_tensor_coalesced_": "all_gather_into_tensor",
         "reduce_": "reduce", "broadcast_": "broadcast", "gather_": "gather", "scatter_": "scatter",
         "alltoall_": "all_to_all", "alltoall_base_": "all_to_all_single", "barrier": "barrier"}


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _full_bytes(op: str, args) -> int:
    """The bytes of the whole tensor the collective works on: the reduced one, or the gathered one."""
    if op in ("_reduce_scatter_base_", "reduce_scatter_", "alltoall_base_", "alltoall_"):
        return _nbytes(args[1])  # (output, input, ...): the input holds every rank's block
    if op in ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_"):
        return _nbytes(args[0])  # (output, input, ...): the output holds every rank's block
    if op == "barrier":
        return 0
    return _nbytes(args[0])


def ring_bytes(name: str, full_bytes: int, world_size: int) -> float:
    """Bytes one rank sends for ``name`` on ``full_bytes`` with a ring of ``world_size`` ranks: an all_reduce is a
    reduce-scatter plus an all-gather, 2(n-1)/n of the tensor; each half alone sends (n-1)/n of it."""
    n = world_size
    if name == "all_reduce":
        return 2 * (n - 1) / n * full_bytes
    if name in ("reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
                "all_to_all", "all_to_all_single"):
        return (n - 1) / n * full_bytes
    if name in ("reduce", "broadcast", "gather", "scatter"):
        return (n - 1) / n * full_bytes  # a pipelined ring or tree: the same order as one half of an all_reduce
    return 0.0


class Traffic(TorchDispatchMode):
    """Record every collective called inside the ``with`` block on this rank (see the module's docstring)."""

    def __init__(self, world_size: int):
        super().__init__()
        self.world_size = world_size
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, op = func.name().partition("::")
        if namespace == "c10d" and op.split(".")[0] in NAMES:
            op = op.split(".")[0]
            self.calls.append((NAMES[op], _full_bytes(op, args)))
        return func(*args, **(kwargs or {}))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls if name != "barrier"]

    def sent(self) -> float:
        """Bytes this rank sent for the collectives it called, as rings send them."""
        return sum(ring_bytes(name, nbytes, self.world_size) for name, nbytes in self.calls)

    def summary(self) -> str:
        """E.g. "all_reduce of 288 bytes": the calls as a learner would name them."""
        return ", ".join(f"{name} of {nbytes:,} bytes" for name, nbytes in self.calls if name != "barrier") or "none"
