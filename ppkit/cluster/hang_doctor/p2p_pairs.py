"""Each rank's send/recv calls held against the peer's: the call that would match one, and whether it differs.

gloo pairs the sends from A to B with B's recvs from A of the same tag in the order each rank posts them
(a pair's queue per tag, over one TCP connection), so A's n-th send to B with tag t meets B's n-th recv
from A with tag t. Each rank's record counts the calls it posted (flight_calls.p2p_posted) and numbers
each one it keeps (``n``). Two facts follow, and only these are stated:

- a call that has not completed (or whose wait raised) whose peer's job has ended without raising, having
  posted fewer such calls than its number: no call will match it in this run (the peer made no more);
- a call and the peer's call of the same number whose byte counts (or dtypes) differ: gloo aborts the
  receiver when more bytes arrive than its buffer holds, and fills a larger buffer only in part.

A recv from any source takes a send whichever rank made it: where the receiver posted one with that tag
in that group, the count says nothing, and nothing is stated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppkit.cluster.hang_doctor.outcomes import ended_cleanly

PARTNER = {"isend": "irecv", "irecv": "isend"}


@dataclass
class P2PFinding:
    """``kind``: "unmatched" (``rank``'s call has no partner, and ``peer``'s job ended), "size_mismatch" or
    "dtype_mismatch" (``calls``: rank -> each side's call). ``blamed``: the ranks it names: for an unmatched
    call, the peer that ended without the matching call, or, where another rank's call would match it
    (``fits``: that rank and its call), the rank whose call names the other peer."""
    kind: str
    rank: int
    call: dict
    peer: int
    calls: dict[int, dict] = field(default_factory=dict)
    peer_ended: str = ""
    made: int = 0  # the partner calls the peer posted toward ``rank`` (unmatched: fewer than ``call["n"]``)
    fits: tuple[int, dict] | None = None
    blamed: tuple[int, ...] = ()

    @property
    def ranks(self) -> frozenset[int]:
        return frozenset(self.calls) if self.calls else frozenset(self.blamed)


def pairs(records: dict[int, dict], ended: dict[int, str], failed=()) -> list[P2PFinding]:
    """What the ranks' kept send/recv calls say against their peers' (see the module's docstring)."""
    posted = {rank: {(g, op, peer, tag): count for g, op, peer, tag, count in rec.get("p2p_posted") or []}
              for rank, rec in records.items()}
    calls = {rank: rec.get("p2p_calls") or [] for rank, rec in records.items()}
    found, seen = [], set()
    for rank in sorted(records):
        for call in calls[rank]:
            peer = call.get("peer")
            if call.get("state") == "completed" or peer is None or not call.get("n") or peer not in records \
                    or _any_source(posted, rank, peer, call):
                continue
            partner_op = PARTNER.get(call["op"])
            made = posted[peer].get((call["group"], partner_op, rank, call["tag"]), 0)
            if made >= call["n"]:
                partner = next((c for c in calls[peer] if c["op"] == partner_op and c["peer"] == rank
                                and _same_lane(c, call) and c.get("n") == call["n"]), None)
                kind = _differs(call, partner) if partner is not None else ""
                pair = frozenset({(rank, call["op"]), (peer, partner_op)}), call["group"], call["tag"], call["n"]
                if kind and pair not in seen:
                    seen.add(pair)
                    found.append(P2PFinding(kind, rank, call, peer, calls={rank: call, peer: partner}))
            elif peer in ended and peer not in failed and ended_cleanly(ended[peer]):
                fits = _fitting(records, calls, posted, rank, peer, call)
                found.append(P2PFinding("unmatched", rank, call, peer, peer_ended=ended[peer], made=made,
                                        fits=fits, blamed=(rank,) if fits else (peer,)))
    return found


def _same_lane(a: dict, b: dict) -> bool:
    return a.get("group") == b.get("group") and a.get("tag") == b.get("tag")


def _any_source(posted: dict, rank: int, peer: int, call: dict) -> bool:
    """The receiving side posted a recv from any source with this tag in this group: counts do not pair."""
    receiver = rank if call["op"] == "irecv" else peer
    return bool(posted.get(receiver, {}).get((call["group"], "irecv", None, call["tag"])))


def _differs(call: dict, partner: dict) -> str:
    if call.get("nbytes") != partner.get("nbytes"):
        return "size_mismatch"
    if call.get("dtype") and partner.get("dtype") and call["dtype"] != partner["dtype"]:
        return "dtype_mismatch"
    return ""


def _fitting(records, calls, posted, rank: int, peer: int, call: dict) -> tuple[int, dict] | None:
    """Another rank's call, not completed, that ``call`` would be paired with if it named that rank instead of
    ``peer``: the partner op toward ``rank``, same group, tag, bytes and dtype, and numbered one past the calls
    ``rank`` posted toward it (so ``call``, renamed, would be the next)."""
    for other in sorted(records):
        if other in (rank, peer):
            continue
        for candidate in calls[other]:
            if (candidate.get("state") != "completed" and candidate.get("op") == PARTNER.get(call["op"])
                    and candidate.get("peer") == rank and _same_lane(candidate, call)
                    and candidate.get("nbytes") == call.get("nbytes") and candidate.get("dtype") == call.get("dtype")
                    and posted[rank].get((call["group"], call["op"], other, call["tag"]), 0) + 1 == candidate.get("n")):
                return other, candidate
    return None
