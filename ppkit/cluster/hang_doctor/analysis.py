"""Match the ranks' records, group by group: the last collective all completed, the first recorded one they disagree on.

Two ranks' calls at one sequence number are compared by torch's own flight-recorder matcher
(torch.distributed.flight_recorder.components.types.Op.match: the op, the sizes, the dtypes);
a rank without a call there has not reached it, and its record says where it is instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = {"COLLECTIVE_TYPE_MISMATCH": "the op differs", "SIZE_OR_SYNTAX_MISMATCH": "the sizes differ",
         "COLLECTIVE_DTYPE_MISMATCH": "the dtypes differ"}


@dataclass
class GroupFinding:
    """One process group: ``last_done`` (seq, op) every rank that answered completed; ``seq`` the
    first collective not completed by all; ``calls`` each rank's call there; ``mismatch`` what
    differs (KINDS' words, "" if nothing), ``torch_says`` torch's matcher's words; ``missing``
    rank -> where it is instead of there; ``unrecorded``: rank -> how it ended, for a rank that ended
    without sending a record (whether it made the call is not known)."""
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


@dataclass(repr=False)
class Diagnosis:
    """What the records say: per group, and the send/recv each blocked rank waits in (``p2p``:
    rank -> its wait, with its peer); ``deadlock``: ranks that each wait on the other."""
    groups: list[GroupFinding]
    p2p: dict[int, dict]
    deadlock: list[tuple[int, int]]
    ended: dict[int, str]
    unanswered: list[int]
    off: list[int]  # ranks whose recorder is off (TORCH_FR_BUFFER_SIZE=0)
    records: dict[int, dict] = field(default_factory=dict)  # what it read: rank -> its record
    world_size: int = 0
    source: str = ""  # where the records come from, where not from the ranks as they are now

    def write_dumps(self, folder: str) -> list[str]:
        """The records as torch's dump files, one per rank (``rank_0``, ...), which
        ``python -m torch.distributed.flight_recorder.fr_trace FOLDER`` reads; their paths."""
        from ppkit.cluster.hang_doctor import fr_dumps

        return fr_dumps.write(self.records, self.world_size, folder)

    @property
    def problem(self) -> bool:
        """A mismatch, a send/recv pair that waits on each other, or a collective some rank never reached."""
        return bool(self.deadlock or any(g.mismatch or g.missing or g.unrecorded for g in self.groups))

    @property
    def mismatched(self) -> list[GroupFinding]:
        return [g for g in self.groups if g.mismatch]

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
    groups = _memberships(records, world_size)
    findings = [f for name, (desc, ranks) in sorted(groups.items(), key=lambda kv: _order(kv[0]))
                if (f := _group(name, desc, ranks, records, ended)) is not None]
    p2p = {rank: r["p2p"] for rank, r in sorted(records.items()) if r.get("p2p")}
    deadlock = [(a, b) for a in p2p for b in p2p if a < b and p2p[a].get("peer") == b and p2p[b].get("peer") == a
                and not _pair(p2p[a]["op"], p2p[b]["op"])]  # a send against a recv: they match
    unanswered = [r for r in range(world_size) if r not in records and r not in ended]
    off = [r for r, rec in sorted(records.items()) if rec.get("buffer", 1) == 0]
    return Diagnosis(findings, p2p, deadlock, ended, unanswered, off, records, world_size)


def _pair(op: str, other: str) -> bool:
    return ("send" in op) != ("send" in other)


def _failed(record: dict) -> dict:
    calls = [dict(call) for call in record.get("calls", [])]
    if calls:
        newest = max(calls, key=lambda call: call["time_created_ns"])
        newest["done"] = False
    return {**record, "calls": calls}


def _order(name: str):
    return (0, int(name)) if name.isdigit() else (1, name)


def _memberships(records: dict[int, dict], world_size: int) -> dict[str, tuple[str, list[int]]]:
    groups: dict[str, tuple[str, list[int]]] = {}
    for record in records.values():
        for name, info in record.get("groups", {}).items():
            groups[name] = (info.get("desc", ""), list(info.get("ranks", [])))
    for record in records.values():
        for call in record.get("calls", []):
            if call["group"] not in groups:
                groups[call["group"]] = (call.get("desc", ""), list(range(world_size)))
    return groups


def _group(name: str, desc: str, ranks: list[int], records: dict, ended: dict) -> GroupFinding | None:
    calls = {r: {c["seq"]: c for c in records[r].get("calls", []) if c["group"] == name and not c["is_p2p"]}
             for r in ranks if r in records}
    if not any(calls.values()):
        return None
    done = {r: max((s for s, c in cs.items() if c["done"]), default=0) for r, cs in calls.items()}
    last = min(done.values())
    completed = _first_mismatch(name, ranks, calls, range(1, last + 1))  # gloo and NCCL may pair unlike calls
    seq = completed.seq if completed else last + 1
    here = {r: cs[seq] for r, cs in calls.items() if seq in cs}
    if not here:
        return None  # every rank that answered completed every call of this group it made
    last_op = next((cs[seq - 1]["op"] for cs in calls.values() if seq - 1 in cs), "")
    finding = completed or _first_mismatch(name, ranks, calls, [seq]) or GroupFinding(name, desc, ranks, None, seq,
                                                                                         here)
    finding.desc, finding.calls = desc, here
    finding.last_done = (seq - 1, last_op) if seq > 1 else None
    absent = [] if completed else [r for r in ranks if r not in here]
    finding.missing = {r: _instead(r, name, records, ended) for r in absent if r in records or r not in ended}
    finding.unrecorded = {r: ended[r] for r in absent if r not in records and r in ended}
    return finding


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
    return None


def _compare(a: dict, b: dict, group: str, ranks: list[int]) -> tuple[str, str]:
    """What differs between two ranks' calls at one sequence number, by torch's matcher."""
    try:
        from torch.distributed.flight_recorder.components.utils import match_one_event

        info = match_one_event(_event(a), _event(b), {group: set(ranks)}, group)
        state = info.state.name
        return KINDS.get(state, ""), (getattr(info, "culprit", None) or "") if state in KINDS else ""
    except (ImportError, AssertionError, KeyError, IndexError, ValueError):  # an op torch's matcher does not know
        for key, words in (("op", "the op differs"), ("input_sizes", "the sizes differ"),
                           ("input_dtypes", "the dtypes differ")):
            if a[key] != b[key]:
                return words, ""
        return "", ""


def _event(call: dict) -> dict:
    """A call as torch's matcher reads a flight-record entry (the state left out: one rank's
    collective may have failed where the other's still waits)."""
    return {"profiling_name": call["profiling_name"], "state": "scheduled",
            "process_group": (call["group"], call["desc"]), "input_sizes": call["input_sizes"],
            "output_sizes": call["output_sizes"], "collective_seq_id": call["seq"],
            "p2p_seq_id": call["p2p_seq"], "input_dtypes": call["input_dtypes"],
            "output_dtypes": call["output_dtypes"], "time_created_ns": call["time_created_ns"]}


def _instead(rank: int, group: str, records: dict, ended: dict) -> str:
    """Where a rank that has not reached a group's collective is."""
    from ppkit.cluster.hang_doctor.report import call_words, line_words

    if rank in ended:
        return ended[rank]
    record = records.get(rank)
    if record is None:
        return "it did not answer (stopped, or busy outside Python)"
    pending = [c for c in record.get("calls", []) if not c["done"] and c["group"] != group]
    if pending:
        return f"it waits in {call_words(pending[0], with_group=True)}"
    if record.get("p2p"):
        wait = record["p2p"]
        return f"it waits in {wait['op']} {'to' if 'send' in wait['op'] else 'from'} rank {wait['peer']}" \
               f"{line_words(wait.get('at'))}"
    return f"it is in its own code, not in a collective{line_words(record.get('at'))} (still computing?)"
