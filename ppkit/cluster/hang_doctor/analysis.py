"""Match the ranks' records, group by group: the last collective all completed, the first recorded one they disagree on.

Two ranks' calls at one sequence number are compared by torch's own flight-recorder matcher
(torch.distributed.flight_recorder.components.types.Op.match: the op, the sizes, the dtypes), and
by the reduce op and root the rank's Python call passed (flight_calls.py); a rank without a call there that
has not completed it has not reached it, and its record says where it is instead. A group's calls
are kept apart by backend ('cpu:gloo,cuda:nccl' counts each backend's calls from 1 under one name).
A difference in calls that completed on every rank is named, and the doctor goes on to the first
call not completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppkit.cluster.hang_doctor.call_compare import _compare
from ppkit.cluster.hang_doctor.elsewhere import instead
from ppkit.cluster.hang_doctor.gather import COMPUTING
from ppkit.cluster.hang_doctor.memberships import memberships
from ppkit.cluster.hang_doctor.memberships import views as group_views
from ppkit.cluster.hang_doctor.p2p_pairs import P2PFinding, pairs
from ppkit.cluster.hang_doctor.splits import split_words
from ppkit.cluster.hang_doctor.words import pair


@dataclass
class GroupFinding:
    """One process group: ``last_done`` (seq, op) every rank that answered completed; ``seq`` the
    first collective not completed by all; ``calls`` each rank's call there; ``mismatch`` what
    differs (KINDS' words, "" if nothing), ``torch_says`` torch's matcher's words; ``missing``
    rank -> where it is instead of there; ``unrecorded``: rank -> how it ended, for a rank that ended
    without sending a record (whether it made the call is not known); ``backend``: set where the group
    has calls of two backends; ``completed``: every rank completed this call (a difference found among
    completed calls)."""
    name: str
    desc: str
    ranks: list[int]
    last_done: tuple[int, str] | None
    seq: int
    calls: dict[int, dict]
    mismatch: str = ""
    torch_says: str = ""
    missing: dict[int, str] = field(default_factory=dict)
    unrecorded: dict[int, str] = field(default_factory=dict)
    backend: str = ""
    completed: bool = False
    splits: list[str] = field(default_factory=list)  # an all_to_all_single's split sizes that disagree, in words
    after: int = 0  # an earlier collective of the group whose calls differ: this one follows from it

    @property
    def raised(self) -> list[int]:
        """Ranks whose call raised as they made it, before the backend ran it (gloo's size checks)."""
        return [rank for rank, call in self.calls.items() if call.get("raised")]

    @property
    def note_only(self) -> bool:
        """Calls that differ only because an earlier collective's did (the ranks are out of step since)."""
        return bool(self.after)

    @property
    def harmless(self) -> bool:
        """Completed with only the shapes differing, each rank's tensors of the same element counts:
        the backend moved the elements in memory order, as it would for equal shapes."""
        if not (self.completed and self.mismatch == "the sizes differ") or self.splits:
            return False
        alike = {(tuple(_numel(s) for s in call["input_sizes"]), tuple(_numel(s) for s in call["output_sizes"]),
                  tuple(call["input_dtypes"]), call.get("reduce_op", "")) for call in self.calls.values()}
        return len(alike) == 1


@dataclass(repr=False)
class Diagnosis:
    """What the records say: per group, and the send/recv each blocked rank waits in (``p2p``:
    rank -> its wait, with its peer and tag); ``deadlock``: cycles of ranks, each blocked on the next
    (the last on the first) in a call that the next one's call does not match."""
    groups: list[GroupFinding]
    p2p: dict[int, dict]
    deadlock: list[list[int]]
    ended: dict[int, str]
    unanswered: list[int]
    off: list[int]  # ranks whose recorder is off (TORCH_FR_BUFFER_SIZE=0)
    records: dict[int, dict] = field(default_factory=dict)  # what it read: rank -> its record
    views: dict[str, dict] = field(default_factory=dict)  # groups the ranks disagree on (memberships.views)
    world_size: int = 0
    source: str = ""  # where the records come from, where not from the ranks as they are now
    p2p_findings: list[P2PFinding] = field(default_factory=list)  # send/recv against the peer's (p2p_pairs.py)

    @property
    def unmatched(self) -> list[tuple[int, ...]]:
        """Per send/recv that nothing will match, the ranks it names (P2PFinding.blamed)."""
        return [f.blamed for f in self.p2p_findings if f.kind == "unmatched"]

    @property
    def p2p_mismatched(self) -> list[P2PFinding]:
        """Send/recv pairs whose sizes or dtypes differ."""
        return [f for f in self.p2p_findings if f.kind != "unmatched"]

    def write_dumps(self, folder: str) -> list[str]:
        """The records as torch's dump files, one per rank (``rank_0``, ...), which
        ``python -m torch.distributed.flight_recorder.fr_trace FOLDER`` reads; their paths."""
        from ppkit.cluster.hang_doctor import fr_dumps

        return fr_dumps.write(self.records, self.world_size, folder)

    @property
    def problem(self) -> bool:
        """A mismatch, a send/recv pair that waits on each other or that nothing will match, or a collective some
        rank never reached."""
        return bool(self.deadlock or self.views or self.p2p_findings
                    or any(g.mismatch and not g.harmless or g.missing or g.unrecorded or g.raised for g in self.groups))

    @property
    def mismatched(self) -> list[GroupFinding]:
        return [g for g in self.groups if g.mismatch and not g.harmless]

    def blocked(self, rank: int) -> bool:
        """The rank's main thread waits (in torch.distributed, a Work's wait(), a library such as
        autograd using no CPU time): not in its own code or computing in a library, where a call it
        started runs on the backend's threads, nor idle between jobs."""
        return rank not in self.ended and self.records.get(rank, {}).get("main") not in COMPUTING

    def __str__(self) -> str:
        from ppkit.cluster.hang_doctor.report import explain

        return explain(self)

    __repr__ = __str__  # a cell that ends with ppkit.collective_doctor() shows the words


def diagnose(records: dict[int, dict], world_size: int, ended: dict[int, str] | None = None,
             failed=()) -> Diagnosis:
    """``records``: rank -> its flight record (gather.ask_records); ``ended``: rank -> how a rank
    that is no longer running ended ("its fn returned", "it was killed by signal SIGABRT");
    ``failed``: ranks whose job raised inside torch.distributed: gloo retires a failed call as if
    it completed, so their newest call counts as not completed."""
    ended = dict(ended or {})
    records = {rank: _failed(record) if rank in failed else record for rank, record in records.items()}
    groups = memberships(records, world_size)
    views = group_views(records)
    for name, view in views.items():  # the view of a rank with calls in the group: its calls are the group's
        callers = [r for r, rec in sorted(records.items()) if any(c["group"] == name for c in rec.get("calls", []))]
        view["shown"] = next((r for r in callers if any(r in seen for seen in view["seen"].values())),
                             min(min(seen) for seen in view["seen"].values()))
        shown = records[view["shown"]].get("groups", {}).get(name) or records[view["shown"]].get("creating") or {}
        groups[name] = (groups[name][0], list(shown.get("ranks", groups[name][1])))
    findings = [f for name, (desc, ranks) in sorted(groups.items(), key=lambda kv: _order(kv[0]))
                for backend in _backends(name, records)
                for f in _group(name, desc, ranks, records, ended, backend)]
    p2p = {rank: r["p2p"] for rank, r in sorted(records.items()) if r.get("p2p")}
    deadlock = _cycles(p2p)
    unanswered = [r for r in range(world_size) if r not in records and r not in ended]
    off = [r for r, rec in sorted(records.items()) if rec.get("buffer", 1) == 0]
    return Diagnosis(findings, p2p, deadlock, ended, unanswered, off, records, views, world_size,
                     p2p_findings=pairs(records, ended, failed))


def _cycles(p2p: dict[int, dict]) -> list[list[int]]:
    """Ranks each blocked on the next in a send or recv that the next one's call does not match."""
    on = {rank: wait["peer"] for rank, wait in p2p.items()
          if wait.get("peer") is not None and not matches(wait, p2p.get(wait["peer"]), rank)}
    cycles, seen = [], set()
    for start in sorted(on):
        path, rank = [], start
        while rank in on and rank not in path and rank not in seen:
            path.append(rank)
            rank = on[rank]
        if rank in path:
            cycles.append(path[path.index(rank):])
        seen.update(path)
    return cycles


def matches(wait: dict, other: dict | None, rank: int) -> bool:
    """``other`` (the peer's wait) is the send or recv that completes ``wait`` (``rank``'s)."""
    return (other is not None and other.get("peer") in (rank, None) and pair(wait["op"], other["op"])
            and wait.get("tag", 0) == other.get("tag", 0))


def _failed(record: dict) -> dict:
    calls = [dict(call) for call in record.get("calls", [])]
    done = dict(record.get("done", {}))
    raised = max((call.get("time_ns", 0) for call in record.get("raised", [])), default=0)
    if calls:
        newest = max(calls, key=lambda call: call["time_created_ns"])
        if raised > newest["time_created_ns"]:  # it raised in a call the backend never ran: the newest completed
            return record
        newest["done"] = False
        lane = f"{newest['group']}:{newest.get('backend', '')}"
        done[lane] = min(done.get(lane, 0), newest["seq"] - 1)
    return {**record, "calls": calls, "done": done}


def _backends(name: str, records: dict) -> list[str]:
    found = sorted({c.get("backend", "") for r in records.values() for c in r.get("calls", []) if c["group"] == name})
    return found if len(found) > 1 else [""]  # one backend: not named


def _numel(size) -> int:
    count = 1
    for extent in size:
        count *= extent
    return count


def _order(name: str):
    return (0, int(name)) if name.isdigit() else (1, name)


def _group(name: str, desc: str, ranks: list[int], records: dict, ended: dict,
           backend: str = "") -> list[GroupFinding]:
    """A difference among the calls every rank completed (the first), then the first call not completed."""
    calls = {r: {c["seq"]: c for c in records[r].get("calls", [])
                 if c["group"] == name and not c["is_p2p"] and (not backend or c.get("backend") == backend)}
             for r in ranks if r in records}
    if not any(calls.values()):
        return []
    done = {r: max([s for s, c in cs.items() if c["done"]] + _done_upto(records[r], name, backend, cs))
            for r, cs in calls.items()}
    last = min(done.values())
    found = []
    earlier = _first_mismatch(name, ranks, calls, range(1, last + 1))  # gloo and NCCL may pair unlike calls
    if earlier is not None:
        earlier.completed = True
        found.append(earlier)
    seq = last + 1
    here = {r: cs[seq] for r, cs in calls.items() if seq in cs}
    raised = {r: call for r in ranks if r not in here and r in records and done.get(r, 0) < seq
              for call in [_raised_call(records[r], name, backend, seq)] if call}
    last_op = next((cs[last]["op"] for cs in calls.values() if last in cs), "")
    if here or raised:
        finding = ((_first_mismatch(name, ranks, calls, [seq]) if here else None)
                   or GroupFinding(name, desc, ranks, None, seq, here))
        finding.calls = dict(sorted({**here, **raised}.items()))
        if not finding.mismatch and here and raised:
            finding.mismatch = _raised_mismatch(here[min(here)], raised)
        if finding.mismatch and earlier is not None and not earlier.harmless:
            finding.after = earlier.seq
        absent = [r for r in ranks if r not in finding.calls and done.get(r, 0) < seq]
        # a rank without a record may have died inside this very call (gloo aborts on a mismatch): not "missing"
        finding.missing = {r: instead(r, name, records, ended) for r in absent if r in records}
        finding.unrecorded = {r: instead(r, name, records, ended) for r in absent if r not in records}
        found.append(finding)
    for finding in found:
        finding.desc, finding.backend = desc, backend
        finding.last_done = (last, last_op) if last else None
    return found


def _raised_call(record: dict, name: str, backend: str, seq: int) -> dict | None:
    """The rank's call ``seq`` of the group that raised as it called it, before the backend ran it (gloo checks
    the sizes first), in the form of a recorded call; None if it has none."""
    for call in record.get("raised", []):
        if call["group"] == name and call["seq"] == seq and (not backend or call.get("backend") == backend):
            return {**call, "op": call["api"], "done": False, "is_p2p": False, "raised": call["error"]}
    return None


def _raised_mismatch(other: dict, raised: dict[int, dict]) -> str:
    """What differs between a recorded call and the calls that raised before the backend ran them."""
    for call in raised.values():
        if call["api"] != (other.get("api") or other["op"]):
            return "the op differs"
        for key, words in (("input_sizes", "the sizes differ"), ("input_dtypes", "the dtypes differ")):
            if call[key] and call[key] != other[key]:
                return words
    return ""


def _done_upto(record: dict, name: str, backend: str, calls: dict) -> list[int]:
    """The last call of the group that the rank completed, from its whole buffer (more than KEEP in flight)."""
    lanes = {f"{name}:{c.get('backend', '')}" for c in calls.values()} if not backend else {f"{name}:{backend}"}
    return [record.get("done", {}).get(lane, 0) for lane in lanes] or [0]


def _first_mismatch(name: str, ranks: list[int], calls: dict, seqs) -> GroupFinding | None:
    """The first of ``seqs`` at which two ranks' calls differ (ranks without that call left out)."""
    for seq in seqs:
        here = {r: cs[seq] for r, cs in calls.items() if seq in cs}
        first = min(here, default=None)
        for rank in sorted(here):
            if rank != first:
                mismatch, torch_says = _compare(here[first], here[rank], name, ranks)
                if mismatch:
                    return GroupFinding(name, "", ranks, None, seq, here, mismatch, torch_says)
        disagree = split_words(here)  # torch's matcher leaves all_to_all's sizes unchecked
        if disagree:
            return GroupFinding(name, "", ranks, None, seq, here, "the sizes differ", splits=disagree)
    return None
