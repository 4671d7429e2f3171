"""Each rank's flight record, asked over the control channel (flight_messages.py)."""

from __future__ import annotations

import json
import time

from ppkit.transport.flight_messages import AskFlightRecord, FlightRecord

COMPUTING = ("own", "idle", "busy")  # main thread states (flight_record._main_state) that wait on no one
WAIT_S = 3.0  # a rank's reader thread answers at once, even while its main thread waits in a collective


def ask_records(send, inbox, ranks, records: dict | None = None, wait: float = WAIT_S) -> dict[int, dict]:
    """rank -> its record (flight_record.snapshot, parsed) for each of ``ranks`` that answers within
    ``wait`` s; ``send(rank, msg)`` is False for a rank that is gone. ``records``: what is known
    already (a rank's last words as it aborted), kept for the ranks that do not answer. What else
    arrives meanwhile is put back in the inbox."""
    found = dict(records or {})
    asked = {rank for rank in ranks if rank not in found and send(rank, AskFlightRecord())}  # found: aborting
    deadline, others = time.monotonic() + wait, []
    while asked:
        item = inbox.next(deadline)
        if item is None:
            break
        if isinstance(item.msg, FlightRecord) and (item.source in asked or item.msg.last_words):
            if item.msg.last_words:  # it aborts: its answer never comes
                found.setdefault(item.source, parse(item.msg.text))
            else:
                found[item.source] = parse(item.msg.text)
            asked.discard(item.source)
        else:
            others.append(item)
    inbox.put_back(others)
    return found


def last_words(item, job_id: int) -> dict | None:
    """The record in ``item`` if it is a rank's last words (sent unasked as it aborts) during job
    ``job_id`` (or between jobs); None for anything else: a late answer, an earlier job's words."""
    msg = item.msg
    if isinstance(msg, FlightRecord) and msg.last_words and msg.job_id in (job_id, None):
        return parse(msg.text)
    return None


def parse(text: str) -> dict:
    try:
        record = json.loads(text)
    except ValueError as exc:
        return {"calls": [], "groups": {}, "p2p": None, "at": {}, "error": f"unreadable record: {exc}"}
    return record if isinstance(record, dict) else {"calls": [], "groups": {}, "error": "not a record"}


def waits_on_peers(record: dict | None) -> bool:
    """The record shows a send/recv the rank is blocked in, or a collective started and not completed
    while its main thread neither is in its own code nor computes in a library (DDP's reducer waits
    inside autograd using no CPU time, measured on gloo). A rank in its own code, or in torch.nn or
    autograd using CPU time, with a gloo call pending is computing: gloo runs the call on its own
    threads. NCCL's calls are the exception, by torch's design: their wait is at ``.item()`` or
    ``synchronize``, in the learner's code (not measured here: no GPU)."""
    if not record:
        return False
    if record.get("p2p") is not None:
        return True
    pending = [call for call in record.get("calls", []) if not call["done"]]
    return bool(pending) and (record.get("main") not in COMPUTING
                              or any(c.get("backend") == "nccl" for c in pending))


def computed_between(before: dict | None, after: dict | None) -> bool:
    """The rank's main thread used CPU time between two of its records: it computed, whatever its frames
    and pending calls look like (thread_cpu.py)."""
    from ppkit.transport.thread_cpu import computed

    if not before or not after:
        return False
    wall = (after.get("cpu_at") or 0) - (before.get("cpu_at") or 0)
    return computed(before.get("cpu_s"), after.get("cpu_s"), wall)


def progress(record: dict | None) -> tuple:
    """What moves while a rank makes progress: its calls' sequence numbers and states, its pending p2p calls."""
    if not record:
        return ()
    return (tuple(sorted((c["group"], c.get("backend", ""), c["seq"], c["done"]) for c in record.get("calls", []))),
            tuple(sorted(record.get("done", {}).items())), len(record.get("p2p_pending", [])),
            str(record.get("p2p")))
