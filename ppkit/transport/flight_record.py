"""A rank's flight record: torch's own record of its recent collectives, read on request.

torch keeps, per process, a ring buffer of the collectives it issued (its "flight recorder",
torch/csrc/distributed/c10d/FlightRecorder.hpp): each one's process group, sequence number, op,
sizes, dtypes and whether it completed. torch 2.14 keeps it by default, for gloo as for NCCL:
2000 entries, or ``TORCH_FR_BUFFER_SIZE`` (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``) read once,
when the first process group is created; 0 turns it off. ppkit sets nothing: it reads the record.
gloo's send and recv are not in the record (torch 2.14), so a rank blocked in one says so from
its main thread's frames instead.

``snapshot`` is what the kernel's collective doctor (ppkit/cluster/hang_doctor/) reads: a JSON
text of plain values. Per group (and backend: 'cpu:gloo,cuda:nccl' counts each from 1), the calls
of its present lifetime only (the buffer outlives destroy_process_group, and a new group reuses the
name): the last ``KEEP``, the oldest ``KEEP`` not completed, and the last completed sequence number
over the whole buffer; each named with what flight_calls.py kept as the learner called it. Also
where the main thread is (its own code, a wait, torch.distributed), and the send or recv it waits
in. The record's own Python stacks are not asked for: turning them into text imports torch._dynamo
on the rank (seconds, and memory), while the main thread's frames name the same line for the call
it waits in. ``on_abort`` sends the record once more when gloo
aborts the process (a size mismatch does: flight_abort.py).
"""

from __future__ import annotations

import json
import linecache
import os
import pickle
import sys
import time

from ppkit.transport import flight_calls, flight_frames, flight_p2p, thread_cpu
from ppkit.transport.flight_abort import HANDLER_S, on_abort  # noqa: F401 - HANDLER_S: the worker's bound

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
NCCL_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DEFAULT_BUFFER = 2000  # torch's own default (FlightRecorder.hpp)
KEEP = 16  # calls per process group sent to the kernel
P2P_CALLS = ("send", "recv", "isend", "irecv")


def buffer_size(environ=os.environ) -> int:
    text = environ.get(BUFFER_ENV, environ.get(NCCL_BUFFER_ENV, str(DEFAULT_BUFFER)))
    try:
        return int(text)
    except ValueError:
        return 0


def snapshot(main_frame, in_job: bool = True, ident: int | None = None) -> str:
    """This rank's record and where its main thread is (``main_frame``: its innermost frame; ``in_job``:
    False between jobs, where the main thread waits for the next one; ``ident``: the main thread's
    threading ident, found from ``main_frame`` where not given, which fails once the thread moved on), as JSON."""
    ident = ident if ident is not None else flight_frames.main_ident(main_frame)
    record = {"buffer": buffer_size(), "calls": [], "groups": {}, "done": {}, "p2p": None, "p2p_pending": [],
              "p2p_calls": [], "p2p_posted": [], "raised": [],
              "at": _learner_line(flight_frames.frames_of(main_frame)),
              "main": _main_state(main_frame, ident) if in_job else "idle", "error": "", "in": "",
              "cpu_s": thread_cpu.seconds(ident), "cpu_at": time.monotonic()}  # the watch compares two looks'
    if record["main"] == "distributed":  # the torch.distributed function it is in (new_group, a store's wait)
        record["in"] = flight_calls.call_site(main_frame, "")[0]
        record["creating"] = _creating(main_frame)
    if "torch.distributed" not in sys.modules:  # no process group was ever created here
        return json.dumps(record)
    errors = []
    awaited = flight_calls.waiting.get(ident)
    for part, read in (("groups", _groups), ("calls", _calls), ("p2p_pending", _p2p_pending),
                       ("p2p_calls", _p2p_calls), ("p2p_posted", lambda: [[*k, v] for k, v in
                                                                       flight_p2p.p2p_posted.items()]),
                       ("p2p", lambda: _p2p_wait(main_frame) or _p2p_awaited(awaited)), ("raised", _raised)):
        try:  # each part on its own: one that fails leaves the others to read
            record[part] = read()
        except Exception as exc:  # noqa: BLE001 - the record is a diagnosis; it never fails the rank
            errors.append(f"{part}: {type(exc).__name__}: {exc}")
    if isinstance(record["calls"], tuple):
        record["calls"], record["done"] = record["calls"]
    waiting = [call for call in record["calls"] if not call["done"]]
    if waiting and record["main"] in ("distributed", "wait") and record["p2p"] is None:
        newest = max(waiting, key=lambda call: call["time_created_ns"])  # the newest: the one it waits in
        if not newest["at"]:  # no record of its call (funcol's reach the backend from C++): where the rank waits
            newest["waits_at"] = record["at"]
    record["error"] = "; ".join(errors)
    return json.dumps(record)


def _raised() -> list[dict]:
    """The collectives of each group's present lifetime that raised before the backend ran them, with the
    learner's line: torch's record has no entry for them."""
    born = flight_calls.born_ns
    return [{**{k: v for k, v in call.items() if k not in ("frames", "born")}, "at": _learner_line(call["frames"])}
            for call in list(flight_calls.raised_calls) if call["born"] == born.get(call["group"], 0)]


def _main_state(frame, ident: int | None) -> str:
    """Where the main thread is, in a job: "wait" (in a Work's wait()), "distributed" (inside torch.distributed),
    "own" (its innermost Python frame is the learner's: computing, sleeping; a gloo call it started
    runs on gloo's threads meanwhile), "busy" (in a library, using CPU time: a Linear's forward, a
    backward) or "other" (in a library, using none: blocked in C++, where DDP's reducer waits inside
    autograd; or its CPU time cannot be read)."""
    if flight_calls.waiting.get(ident) is not None:
        return "wait"
    if _in_distributed(frame):
        return "distributed"
    if frame is not None and _own_code(frame.f_code.co_filename):
        return "own"
    if frame is None:
        return ""
    return "busy" if thread_cpu.computing(ident) else "other"


def _calls() -> tuple[list[dict], dict[str, int]]:
    """Each group's calls of its present lifetime (the last KEEP, and every one not completed), and
    "group:backend" -> its last completed sequence number, from the whole buffer."""
    from torch._C import _distributed_c10d as c10d

    dumps = [c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)]
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized() and hasattr(c10d, "_dump_nccl_trace"):
        dumps.append(c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    entries = list({_identity(entry): entry for raw in dumps for entry in pickle.loads(raw).get("entries", [])}
                   .values())  # one entry that both dumps hold counts once
    by_lane: dict[str, list] = {}
    for entry in sorted(_present(entries), key=lambda e: e.get("time_created_ns") or 0):
        call = _call(entry)
        by_lane.setdefault(f"{call['group']}:{call['backend']}", []).append(call)
    _name_api_calls(by_lane)
    done = {lane: max((c["seq"] for c in calls if c["done"] and not c["is_p2p"]), default=0)
            for lane, calls in by_lane.items()}
    kept = [call for calls in by_lane.values()  # the oldest not completed: where a hang starts
            for call in [c for c in calls[:-KEEP] if not c["done"]][:KEEP] + calls[-KEEP:]]
    return kept, done


def _identity(entry: dict) -> tuple:
    return (entry["profiling_name"], tuple(entry["process_group"]), entry.get("pg_id"), entry["collective_seq_id"],
            entry["p2p_seq_id"], entry.get("time_created_ns"))


def _present(entries: list[dict]) -> list[dict]:
    """The entries of each group's present lifetime (or, for a destroyed group, its last one): torch's
    buffer outlives destroy_process_group, and a new group reuses the name and counts from 1."""
    newest: dict[tuple, int] = {}
    for entry in entries:
        lane = (str(entry["process_group"][0]), entry["profiling_name"].partition(":")[0])
        newest[lane] = max(newest.get(lane, -1), entry.get("pg_id", 0))
    born = flight_calls.born_ns
    return [entry for entry in entries
            if ((entry.get("time_created_ns") or 0) >= born[str(entry["process_group"][0])]
                if str(entry["process_group"][0]) in born else
                entry.get("pg_id", 0) == newest[(str(entry["process_group"][0]),
                                                 entry["profiling_name"].partition(":")[0])])]


def _name_api_calls(by_lane: dict[str, list]) -> None:
    """Each call's API name, reduce op, root and line, from the Python side (flight_calls.api_ring)."""
    for group, backend, first, last, api, reduce_op, root, frames, splits in list(flight_calls.api_ring):
        for lane in ([f"{group}:{backend}"] if backend else [k for k in by_lane if k.startswith(f"{group}:")]):
            for call in by_lane.get(lane, []):
                if first <= call["seq"] <= last and not call["is_p2p"]:
                    call.update(api=api, api_seqs=[first, last], reduce_op=reduce_op, root=root,
                                at=_learner_line(frames))
                    if splits is not None:
                        call["splits"] = splits


def _call(entry: dict) -> dict:
    backend, _, name = entry["profiling_name"].partition(":")
    op, _, meta = name.partition(" ")
    peer = None
    if op in ("send", "recv") and meta:  # "send 0->1", "recv 1<-0" (ranks of the group)
        peer = int(meta.split("->")[1] if op == "send" else meta.split("<-")[1])
    return {"group": str(entry["process_group"][0]), "desc": str(entry["process_group"][1]),
            "pg_id": entry.get("pg_id"), "seq": entry["collective_seq_id"], "p2p_seq": entry["p2p_seq_id"],
            "is_p2p": entry["is_p2p"], "op": op, "peer": peer, "backend": backend,
            "profiling_name": entry["profiling_name"],
            "input_sizes": entry["input_sizes"], "output_sizes": entry["output_sizes"],
            "input_dtypes": entry["input_dtypes"], "output_dtypes": entry["output_dtypes"],
            "state": entry["state"], "done": bool(entry.get("retired")) or entry["state"] == "completed",
            "time_created_ns": entry.get("time_created_ns") or 0, "at": {}}


def _groups() -> dict[str, dict]:
    """Each process group's name -> its description and global ranks."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return {}
    world = dist.distributed_c10d._world
    return {str(pg.group_name): {"desc": str(getattr(pg, "group_desc", "")), "ranks": sorted(ranks)}
            for pg, ranks in world.pg_group_ranks.items()
            if isinstance(pg, dist.ProcessGroup)}  # a group this rank is not in: GroupMember.NON_GROUP_MEMBER, an int


def _creating(frame) -> dict | None:
    """The group the main thread is creating (in new_group): its name and global ranks, as this rank
    names it (torch counts groups per rank: ranks that create them in another order differ)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_new_process_group_helper" and code.co_filename.endswith("distributed_c10d.py"):
            local = frame.f_locals
            return {"name": str(local.get("group_name")), "ranks": sorted(local.get("global_ranks_in_group") or [])}
        frame = frame.f_back
    return None


def _p2p_wait(frame) -> dict | None:
    """The send or recv the main thread is blocked in, with its peer and tag (gloo does not record these)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in P2P_CALLS and code.co_filename.endswith("distributed_c10d.py"):
            local = frame.f_locals
            op = code.co_name
            peer = local.get("dst" if op in ("send", "isend") else "src")
            if peer is None:  # a rank of the group: made global, as the doctor compares them
                group_peer = local.get("group_dst" if op in ("send", "isend") else "group_src")
                peer = flight_p2p.global_rank(local.get("group"), group_peer)
            tensor = local.get("tensor")
            return {"op": op, "peer": peer, "sizes": [list(tensor.shape)] if tensor is not None else [],
                    "dtype": str(tensor.dtype).replace("torch.", "") if tensor is not None else "",
                    "tag": local.get("tag") or 0, "at": _learner_line(flight_frames.frames_of(frame))}
        frame = frame.f_back
    return None


def _p2p_awaited(work) -> dict | None:
    """The isend or irecv whose Work the main thread waits on (``req.wait()``)."""
    found = [call for call in list(flight_p2p.p2p_ring) if call.work is work] if work is not None else []
    return _p2p_words(found[0]) if found else None


def _p2p_words(call) -> dict:
    return {"op": call.op, "peer": call.peer, "sizes": call.sizes, "dtype": call.dtype, "tag": call.tag,
            "at": _learner_line(call.frames)}


def _p2p_calls() -> list[dict]:
    """The kept send/recv calls of each group's present lifetime (a new group of the same name numbers its
    calls from 1 again): each with its group, number (flight_p2p.P2PCall.n), bytes and state ("pending",
    "completed", or "failed": a wait on it raised)."""
    calls = [(call, "failed" if call.failed else "completed") for call in list(flight_p2p.p2p_done)]
    for call in list(flight_p2p.p2p_ring):
        if call.work.is_completed():
            call = flight_p2p.settled(call)
            calls.append((call, "failed" if call.failed else "completed"))
        else:
            calls.append((call, "pending"))
    born = flight_calls.born_ns
    return [{**_p2p_words(call), "group": call.group, "n": call.n, "nbytes": call.nbytes, "state": state}
            for call, state in calls if call.born == born.get(call.group, 0)]  # the group's present lifetime


def install(send_last_words) -> None:
    """On a rank: keep what torch's record lacks (flight_calls.watch), and send the record as it aborts."""
    flight_calls.watch()
    on_abort(send_last_words)


def _p2p_pending() -> list[dict]:
    """The ring's calls whose Work has not completed, oldest first."""
    return [_p2p_words(call) for call in list(flight_p2p.p2p_ring) if not call.work.is_completed()]


def _in_distributed(frame) -> bool:
    inside = os.path.join(flight_frames.torch_dir(), "distributed")
    while frame is not None:
        if frame.f_code.co_filename.startswith(inside):
            return True
        frame = frame.f_back
    return False


def _learner_line(frames) -> dict:
    """The innermost frame outside torch, ppkit and the standard library: the learner's line."""
    for filename, line, name in frames:
        if flight_frames.is_learners(filename):
            return {"file": filename, "line": line, "func": name,
                    "code": linecache.getline(filename, line).strip()}
    return {}


def _own_code(filename: str) -> bool:
    """The learner's code, a cell's included (``<%%torchrun cell 3>``, ``<ipython-input-...>``)."""
    return not filename.startswith("<frozen") if filename.startswith("<") else flight_frames.is_learners(filename)
