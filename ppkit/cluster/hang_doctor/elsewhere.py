"""Where a rank that has not reached a group's collective is instead, from its record: its main
thread's state (a wait, torch.distributed, its own code, idle) and the calls it has pending."""

from __future__ import annotations

from ppkit.cluster.hang_doctor.gather import COMPUTING
from ppkit.cluster.hang_doctor.words import call_words, line_words, p2p_words


def instead(rank: int, group: str, records: dict, ended: dict) -> str:
    """Where a rank that has not reached a group's collective is."""
    if rank in ended:
        return ended[rank]
    record = records.get(rank)
    if record is None:
        return "it did not answer (stopped, or busy outside Python)"
    pending = [c for c in record.get("calls", []) if not c["done"] and c["group"] != group]
    if record.get("p2p"):
        wait = record["p2p"]
        return f"it waits in {p2p_words(wait)}{line_words(wait.get('at'))}"
    if pending and record.get("main") not in COMPUTING:
        return f"it waits in {call_words(pending[0], with_group=True)}"
    started = ([call_words(c, with_group=True) for c in pending[:1]]
               + [p2p_words(w) + line_words(w.get("at"), "called ") for w in record.get("p2p_pending", [])[:1]])
    left = f"; it started {' and '.join(started)}, not completed yet" if started else ""
    main, at = record.get("main"), line_words(record.get("at"))
    if main == "idle":
        return f"its job returned, so it is idle{left}"
    if main == "own":
        return f"it is in its own code, not in a collective{at} (still computing?){left}"
    if main == "busy":
        return (f"it computes in a library, not in a collective{at} (its main thread used CPU time as its record "
                f"was read){left}")
    if main == "distributed":
        inside = f" ({record['in']})" if record.get("in") else ""
        if record.get("creating"):
            made = record["creating"]
            inside = f" ({record.get('in') or 'new_group'}: creating group {made['name']} of ranks {made['ranks']})"
        return (f"it is inside torch.distributed{inside}{at}, in no collective its record holds: a call that "
                f"waits on the other ranks, such as new_group or a barrier on the store{left}")
    if main == "wait":
        return (f"it waits on a Work (req.wait()){at} that its record does not name (more point-to-point calls "
                f"in flight than it keeps, or a call it does not watch){left}")
    if main == "other":
        return f"its main thread is in a library{at}, in no collective its record holds{left}"
    return f"where its main thread is, its record does not say{left}"
