"""Which ops of a trace are communication: gloo's and nccl's collectives, c10d's ops, point-to-point.

``aten::`` and ``prims::`` ops are compute even where their name says "broadcast" (``aten::broadcast_tensors``,
``prims::broadcast_in_dim``, which torch.compile's and pipelining's traces hold)."""

from __future__ import annotations

import re

COMPUTE, COMMUNICATION = "compute", "communication"
_COMMUNICATION = re.compile(
    r"gloo|nccl|c10d::|record_param_comms|processgroup|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all"
    r"|broadcast|barrier|(^|[:_.\s])i?send\b|(^|[:_.\s])i?recv\b", re.IGNORECASE)


def kind(name: str) -> str:
    """``"communication"`` or ``"compute"`` for an op's name as the profiler records it."""
    if name.startswith(("aten::", "prims::")):
        return COMPUTE
    return COMMUNICATION if _COMMUNICATION.search(name) else COMPUTE
