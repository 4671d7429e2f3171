"""Which ops of a trace are communication: gloo's and nccl's collectives, c10d's ops, point-to-point.

``aten::`` and ``prims::`` ops are compute even where their name says "broadcast" (``aten::broadcast_tensors``,
``prims::broadcast_in_dim``, which torch.compile's and pipelining's traces hold). A GPU kernel is
communication when it is NCCL's (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``) or a collective's
(symmetric memory's ``one_shot_all_reduce_kernel``); "broadcast" in a kernel's name is an elementwise
broadcast (CUTLASS's ``EpilogueWithBroadcast``), compute.

A ``user_annotation`` is a label (``record_function``'s, FSDP's ``FSDP::all_gather (layers.0)``), never
communication by its name: its ops say what ran inside it. The backends' own spans (``gloo:all_reduce``,
``nccl:send``) are the exception. FSDP2's packing copies (``fsdp::all_gather_copy_in``,
``FSDP::all_gather_copy_out``) are compute, and the wait of a functional collective
(``_c10d_functional::wait_tensor``) is communication: the thread waits there for it."""

from __future__ import annotations

import re

COMPUTE, COMMUNICATION = "compute", "communication"
_COMMUNICATION = re.compile(
    r"gloo|nccl|c10d::|c10d_functional::|wait_tensor|record_param_comms|processgroup|all_?reduce"
    r"|all_?gather(?!_copy_(in|out))|reduce_?scatter|all_?to_?all"
    r"|broadcast|barrier|(^|[:_.\s])i?send\b|(^|[:_.\s])i?recv\b", re.IGNORECASE)


_COMMUNICATION_KERNEL = re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all", re.IGNORECASE)
BACKEND_SPANS = ("gloo:", "nccl:")  # a process group's Work, recorded as a user_annotation
LABELS = "user_annotation"
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}  # events on a GPU's streams


def kind(name: str, category: str = "") -> str:
    """``"communication"`` or ``"compute"`` for an op's name (and the trace's category) as the profiler
    records it."""
    if category == "kernel":
        return COMMUNICATION if _COMMUNICATION_KERNEL.search(name) else COMPUTE
    if name.startswith(("aten::", "prims::")) or (category == LABELS and not name.startswith(BACKEND_SPANS)):
        return COMPUTE
    return COMMUNICATION if _COMMUNICATION.search(name) else COMPUTE
