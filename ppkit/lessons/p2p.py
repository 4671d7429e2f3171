"""Lesson 1, point-to-point: a recv that never gets its send, and a measured picture of waiting.

The seed's own send/recv examples are in ``ppkit.lessons.seed001``; this module holds what the
lesson adds to them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppkit.lessons.timeline import Timeline

_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<func>.+)$')


def recv_without_send(rank, size):
    """Rank 1 waits for a message that rank 0 never sends (rank 0 "forgot" its ``dist.send``)."""
    tensor = torch.zeros(1)
    if rank == 1:
        dist.recv(tensor, src=0)  # blocks until rank 0 sends: it never will
    return tensor.item()


@dataclass(frozen=True)
class BlockedCall:
    """Where one rank was waiting when a job timed out."""

    rank: int
    torch_call: str     # e.g. "dist.recv", or "" when the rank waits outside torch.distributed
    function: str       # the user's function that made the call
    filename: str
    lineno: int
    code: str           # the source line, when the worker could read it

    def __str__(self) -> str:
        where = f"{self.function}() line {self.lineno}"
        code = f": {self.code}" if self.code else ""
        if self.torch_call:
            return f"rank {self.rank} is blocked in {self.torch_call}, called from {where}{code}"
        return f"rank {self.rank} is still running {where}{code}"


def _frames(stack_text: str) -> list[dict]:
    frames: list[dict] = []
    for line in stack_text.splitlines():
        match = _FRAME.match(line)
        if match:
            frames.append({"file": match["file"], "line": int(match["line"]), "func": match["func"],
                           "code": ""})
        elif frames and line.startswith("    ") and not frames[-1]["code"]:
            frames[-1]["code"] = line.strip()
    return frames


def blocked_call(rank: int, stack_text: str) -> BlockedCall | None:
    """Read one rank's stack (as ``JobTimeoutError.stacks`` holds it): which torch.distributed call
    it waits in, and which line of the user's function made that call."""
    frames = _frames(stack_text)
    starts = [i for i, f in enumerate(frames) if f["func"] == "_run_job"]
    user = frames[starts[-1] + 1:] if starts else frames
    if not user:
        return None
    first_torch = next((i for i, f in enumerate(user) if "/torch/" in f["file"].replace("\\", "/")), None)
    if first_torch is None:
        caller, call = user[-1], ""
    else:
        caller = user[max(first_torch - 1, 0)]
        c10d = [f for f in user[first_torch:] if f["file"].endswith("distributed_c10d.py")]
        call = "dist." + (c10d[0] if c10d else user[first_torch])["func"]
    return BlockedCall(rank, call, caller["func"], caller["file"], caller["line"], caller["code"])


def explain_timeout(err, world_size: int | None = None) -> str:
    """Say, for a ``ppkit.JobTimeoutError``, which rank waits where and which ranks had finished."""
    lines = []
    for rank, text in sorted(err.stacks.items()):
        call = blocked_call(rank, text)
        lines.append(str(call) if call else f"rank {rank}: no stack was available")
    if world_size is not None:
        done = [r for r in range(world_size) if r not in err.stacks]
        if done:
            lines.append(f"rank(s) {done} had already returned, so nobody is left to answer.")
    return "\n".join(lines)


def _send_or_recv(rank, tensor) -> None:
    if rank == 0:
        dist.send(tensor, dst=1)
    else:
        dist.recv(tensor, src=0)


def waiting_demo(rank, size, slow_s: float = 0.3, fast_s: float = 0.1):
    """Ranks 0 and 1 exchange three messages with uneven work before each; returns the spans.

    blocking      rank 0 works ``slow_s`` then sends;  rank 1 works ``fast_s`` then receives
    early sender  rank 0 works ``fast_s`` then sends;  rank 1 works ``slow_s`` then receives
    isend/irecv   as "early sender", but rank 0 uses isend and keeps working until ``slow_s``,
                  and rank 1 posts irecv before its work
    The "work" is ``time.sleep``: it stands for computing and costs no CPU on a shared machine.
    Ranks 2 and up take no part and return an empty list.
    """
    tl = Timeline(rank)
    dist.barrier()  # start together (every rank must join a barrier, even those that then leave)
    if rank > 1:
        return tl.spans
    peer = 1 - rank
    tensor = torch.zeros(1000)

    # 1. blocking send/recv: the receiver waits for the slow sender
    with tl.span("work", "compute", phase="blocking"):
        time.sleep(slow_s if rank == 0 else fast_s)
    with tl.span("send" if rank == 0 else "recv", "comm", peer=peer, phase="blocking"):
        _send_or_recv(rank, tensor)

    # 2. the sender is early: with gloo, send waits until the receiver has posted its recv
    with tl.span("work", "compute", phase="early sender"):
        time.sleep(fast_s if rank == 0 else slow_s)
    with tl.span("send" if rank == 0 else "recv", "comm", peer=peer, phase="early sender"):
        _send_or_recv(rank, tensor)

    # 3. the same exchange, non-blocking: nobody waits, the transfer overlaps the work
    if rank == 0:
        with tl.span("work", "compute", phase="isend/irecv"):
            time.sleep(fast_s)
        req = dist.isend(tensor, dst=1)
        tl.mark("isend", peer=1, phase="isend/irecv")
        with tl.span("more work", "compute", phase="isend/irecv"):
            time.sleep(slow_s - fast_s)
    else:
        req = dist.irecv(tensor, src=0)
        tl.mark("irecv", peer=0, phase="isend/irecv")
        with tl.span("work", "compute", phase="isend/irecv"):
            time.sleep(slow_s)
    with tl.span("wait", "comm", peer=peer, phase="isend/irecv"):
        req.wait()
    return tl.spans
