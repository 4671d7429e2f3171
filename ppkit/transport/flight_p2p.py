"""The point-to-point calls a rank posted, kept beside torch's flight record: each one's peer, tag and number."""

from __future__ import annotations

import collections
from typing import NamedTuple

P2P_KEEP = 32  # point-to-point calls kept (gloo's are not in torch's record)


class P2PCall(NamedTuple):
    op: str  # "isend" or "irecv" (a blocking send or recv is one of these and a wait)
    peer: int | None  # global rank; None: a recv from any source
    sizes: list
    dtype: str
    tag: int
    frames: list
    group: str
    n: int  # its number among this rank's calls of this op to this peer with this tag in this group, from 1
    nbytes: int
    work: object  # its Work (None once completed and moved to p2p_done)
    failed: bool = False  # a wait on it raised
    born: int = 0  # born_ns of its group's lifetime: a new group of the same name numbers its calls from 1 again


p2p_ring: list[P2PCall] = []  # pending ones, the oldest and the newest (keep_p2p)
p2p_done: collections.deque = collections.deque(maxlen=P2P_KEEP)  # the latest completed ones, work=None
p2p_posted: dict[tuple[str, str, int | None, int], int] = {}  # (group, op, peer, tag) -> calls posted
failed_works: set[int] = set()  # id() of a ring call's Work whose wait raised (the ring keeps it alive)


def _p2p_key(group, name: str, args, kwargs) -> tuple[str, str, int | None, int]:
    peer = None if name == "recv_anysource" else global_rank(
        group, args[0] if args else kwargs.get("dstRank" if name == "send" else "srcRank"))
    tag = kwargs.get("tag", args[-1] if len(args) >= (1 if name == "recv_anysource" else 2) else 0)
    return str(group.group_name), "isend" if name == "send" else "irecv", peer, tag


def _posted(group, name: str, args, kwargs) -> tuple[tuple | None, int]:
    """Count the call: its (group, op, global peer, tag) and its number among the rank's calls with them, from 1."""
    try:
        key = _p2p_key(group, name, args, kwargs)
    except Exception:  # noqa: BLE001 - the record is a diagnosis; it never fails the call
        return None, 0
    p2p_posted[key] = p2p_posted.get(key, 0) + 1
    return key, p2p_posted[key]


def keep_p2p(call: P2PCall) -> None:
    """Add a send or recv to the ring. Completed calls move to p2p_done without their Work (their
    tensors are not kept alive); with more than P2P_KEEP pending, the oldest half and the newest half
    are kept: the oldest pending call is where a hang starts, the newest is the one a rank waits on
    after a loop of them."""
    pending = []
    for kept in p2p_ring:
        if kept.work.is_completed():
            p2p_done.append(settled(kept))
            failed_works.discard(id(kept.work))
        else:
            pending.append(kept)
    p2p_ring[:] = pending
    if len(p2p_ring) >= P2P_KEEP:
        del p2p_ring[P2P_KEEP // 2]
    p2p_ring.append(call)


def settled(call: P2PCall) -> P2PCall:
    """A completed call as p2p_done keeps it: without its Work, with whether a wait on it raised."""
    return call._replace(work=None, failed=call.failed or id(call.work) in failed_works)


def global_rank(group, group_rank):
    if group_rank is None or group is None:
        return group_rank
    import torch.distributed as dist

    return dist.get_global_rank(group, group_rank)
