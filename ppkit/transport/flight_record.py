"""A rank's flight record: torch's own record of its recent collectives, read on request.

torch keeps, per process, a ring buffer of the collectives it issued (its "flight recorder",
torch/csrc/distributed/c10d/FlightRecorder.hpp): each one's process group, sequence number, op,
sizes, dtypes and whether it completed. torch 2.14 keeps it by default, for gloo as for NCCL:
2000 entries, or ``TORCH_FR_BUFFER_SIZE`` (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``) read once,
when the first process group is created; 0 turns it off. ppkit sets nothing: it reads the record.
gloo's send and recv are not in the record (torch 2.14), so a rank blocked in one says so from
its main thread's frames instead.

``snapshot`` is what the kernel's collective doctor (ppkit/cluster/hang_doctor/) reads: a JSON
text of plain values, the last ``KEEP`` calls of each group, the one the main thread waits in with
the learner's line that called it. The record's own Python stacks are not asked for: turning them
into text imports torch._dynamo on the rank (seconds, and memory), while the main thread's frames
name the same line for the call it waits in. ``on_abort`` sends the record once more when gloo
aborts the process (a size mismatch does).
"""

from __future__ import annotations

import collections
import ctypes
import json
import linecache
import os
import pickle
import signal
import sys

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
NCCL_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DEFAULT_BUFFER = 2000  # torch's own default (FlightRecorder.hpp)
KEEP = 16  # calls per process group sent to the kernel
P2P_CALLS = ("send", "recv", "isend", "irecv")
P2P_KEEP = 32  # point-to-point calls kept by watch_p2p (gloo's are not in torch's record)
_OWN = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)  # ppkit/ itself


def buffer_size(environ=os.environ) -> int:
    text = environ.get(BUFFER_ENV, environ.get(NCCL_BUFFER_ENV, str(DEFAULT_BUFFER)))
    try:
        return int(text)
    except ValueError:
        return 0


def snapshot(main_frame) -> str:
    """This rank's record and where its main thread is (``main_frame``: its innermost frame), as JSON."""
    record = {"buffer": buffer_size(), "calls": [], "groups": {}, "p2p": None, "p2p_pending": [],
              "at": _learner_line(_frames_of(main_frame)), "error": ""}
    if "torch.distributed" not in sys.modules:  # no process group was ever created here
        return json.dumps(record)
    errors = []
    for part, read in (("groups", _groups), ("calls", _calls), ("p2p_pending", _p2p_pending),
                       ("p2p", lambda: _p2p_wait(main_frame) or next(iter(record["p2p_pending"]), None))):
        try:  # each part on its own: one that fails leaves the others to read
            record[part] = read()
        except Exception as exc:  # noqa: BLE001 - the record is a diagnosis; it never fails the rank
            errors.append(f"{part}: {type(exc).__name__}: {exc}")
    waiting = [call for call in record["calls"] if not call["done"]]
    if waiting and _in_distributed(main_frame):  # the newest call not completed is the one it waits in
        max(waiting, key=lambda call: call["time_created_ns"])["at"] = record["at"]
    record["error"] = "; ".join(errors)
    return json.dumps(record)


def _calls() -> list[dict]:
    from torch._C import _distributed_c10d as c10d

    dumps = [c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False)]
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized() and hasattr(c10d, "_dump_nccl_trace"):
        dumps.append(c10d._dump_nccl_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False))
    entries = [entry for raw in dumps for entry in pickle.loads(raw).get("entries", [])]
    by_group: dict[str, list] = {}
    for entry in sorted(entries, key=lambda e: e.get("time_created_ns") or 0):
        by_group.setdefault(str(entry["process_group"][0]), []).append(_call(entry))
    return [call for calls in by_group.values() for call in calls[-KEEP:]]


def _call(entry: dict) -> dict:
    backend, _, name = entry["profiling_name"].partition(":")
    op, _, meta = name.partition(" ")
    peer = None
    if op in ("send", "recv") and meta:  # "send 0->1", "recv 1<-0" (ranks of the group)
        peer = int(meta.split("->")[1] if op == "send" else meta.split("<-")[1])
    return {"group": str(entry["process_group"][0]), "desc": str(entry["process_group"][1]),
            "seq": entry["collective_seq_id"], "p2p_seq": entry["p2p_seq_id"], "is_p2p": entry["is_p2p"],
            "op": op, "peer": peer, "backend": backend, "profiling_name": entry["profiling_name"],
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


def _p2p_wait(frame) -> dict | None:
    """The send or recv the main thread is blocked in, with its peer (gloo does not record these)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name in P2P_CALLS and code.co_filename.endswith("distributed_c10d.py"):
            local = frame.f_locals
            op = code.co_name
            peer = local.get("dst" if op in ("send", "isend") else "src")
            if peer is None:  # a rank of the group: made global, as the doctor compares them
                group_peer = local.get("group_dst" if op in ("send", "isend") else "group_src")
                peer = _global_rank(local.get("group"), group_peer)
            tensor = local.get("tensor")
            return {"op": op, "peer": peer, "sizes": [list(tensor.shape)] if tensor is not None else [],
                    "dtype": str(tensor.dtype).replace("torch.", "") if tensor is not None else "",
                    "at": _learner_line(_frames_of(frame))}
        frame = frame.f_back
    return None


def install(send_last_words) -> None:
    """On a rank: keep its point-to-point calls (``watch_p2p``) and send its record as it aborts (``on_abort``)."""
    watch_p2p()
    on_abort(send_last_words)


def _global_rank(group, group_rank):
    if group_rank is None or group is None:
        return group_rank
    import torch.distributed as dist

    return dist.get_global_rank(group, group_rank)


_p2p_ring: collections.deque = collections.deque(maxlen=P2P_KEEP)  # (op, peer, sizes, dtype, line, work)


def watch_p2p() -> None:
    """Keep this rank's point-to-point calls (send, recv, isend, irecv, batch_isend_irecv: all go
    through ProcessGroup.send, recv and recv_anysource) in a small ring, since torch's record has
    none for gloo: each one's op, peer (a global rank), sizes, the learner's line and its Work, which
    says whether it completed. The functions torch's P2POp compares by identity are left as they are."""
    try:
        from torch._C._distributed_c10d import ProcessGroup
    except ImportError:  # a torch built without distributed
        return
    for name in ("send", "recv", "recv_anysource"):
        original = getattr(ProcessGroup, name)
        if not getattr(original, "ppkit_watched", False):
            setattr(ProcessGroup, name, _watched_p2p(name, original))


def _watched_p2p(name: str, original):
    def call(group, tensors, *args):
        work = original(group, tensors, *args)
        try:
            if work is not None:
                peer = _global_rank(group, args[0]) if name != "recv_anysource" else None
                op = "isend" if name == "send" else "irecv"
                frames = _frames_of(sys._getframe(1))
                while _p2p_ring and _p2p_ring[0][-1].is_completed():  # done: its tensors are not kept alive
                    _p2p_ring.popleft()
                _p2p_ring.append((op, peer, [list(t.shape) for t in tensors],
                                  str(tensors[0].dtype).replace("torch.", "") if tensors else "",
                                  frames, work))
        except Exception:  # noqa: BLE001 - the record is a diagnosis; it never fails the call
            pass
        return work

    call.ppkit_watched = True
    return call


def _p2p_pending() -> list[dict]:
    """The ring's calls whose Work has not completed, oldest first."""
    return [{"op": op, "peer": peer, "sizes": sizes, "dtype": dtype, "at": _learner_line(frames)}
            for op, peer, sizes, dtype, frames, work in list(_p2p_ring) if not work.is_completed()]


def _in_distributed(frame) -> bool:
    inside = os.path.join(_torch_dir(), "distributed")
    while frame is not None:
        if frame.f_code.co_filename.startswith(inside):
            return True
        frame = frame.f_back
    return False


def _torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(torch.__file__) if torch is not None and torch.__file__ else os.sep + "torch" + os.sep


def _frames_of(frame) -> list[tuple[str, int, str]]:
    """Innermost first, as the flight recorder lists them."""
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames


def _learner_line(frames) -> dict:
    """The innermost frame outside torch, ppkit and the standard library: the learner's line."""
    for filename, line, name in frames:
        if _is_learners(filename):
            return {"file": filename, "line": line, "func": name,
                    "code": linecache.getline(filename, line).strip()}
    return {}


def _is_learners(filename: str) -> bool:
    if filename.startswith("<") and not filename.startswith(("<%%ranks", "<%%torchrun")):
        return filename.startswith("<ipython-input")
    norm = filename.replace("\\", "/")
    return not (any(filename.startswith(own) for own in _OWN) or filename.startswith(_torch_dir())
                or "/site-packages/" in norm or "/lib/python3" in norm)


_on_abort = None  # the handler (kept alive: ctypes calls it from C)
_previous = None  # SIGABRT's action before on_abort: restored as the handler ends, and in forked children
_owner = None  # the pid that installed the handler: a forked child never speaks for the rank
HANDLER_S = 3  # the most seconds the last words (its output, then its record) may take: then SIGALRM ends it


class _SigAction(ctypes.Structure):  # glibc's struct sigaction (the same on x86_64 and aarch64)
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


def on_abort(send_record) -> None:
    """When the process aborts (gloo's abort() on a size mismatch: a C++ exception in its own thread),
    ``send_record()`` runs first, so the kernel learns what this rank had issued. The handler is
    C-level (libc's sigaction), since Python's own handler would run only after the abort.

    Running Python in a signal handler is not async-signal-safe, so the handler is bounded: it arms
    ``alarm(HANDLER_S)`` with SIGALRM's default action first, so last words that cannot be sent
    (a lock the interrupted thread holds) still end the process. It then restores SIGABRT's previous
    action (faulthandler's, if enabled: its traceback still prints) and raises SIGABRT again, which
    that action receives once the handler returns. A forked child (a DataLoader worker) gets the
    previous action back at fork, and the handler checks its pid, so a child never writes on the
    rank's channel."""
    global _on_abort, _previous, _owner
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(_SigAction), ctypes.POINTER(_SigAction)]
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
    raise_signal = getattr(libc, "raise")  # libc's raise(): a Python keyword

    def restore() -> None:
        if _previous is not None:
            libc.sigaction(signal.SIGABRT, ctypes.byref(_previous), None)

    def last_words(signum):
        alarm_action = libc.signal(signal.SIGALRM, ctypes.c_void_p(0))  # SIG_DFL: a stuck handler ends the process
        libc.alarm(HANDLER_S)
        restore()
        if os.getpid() == _owner:
            try:
                send_record()
            except BaseException:  # noqa: BLE001 - the process is ending either way
                pass
        libc.alarm(0)  # sent (or dropped) in time: SIGALRM as it was, for a previous action that lets it live on
        libc.signal(signal.SIGALRM, ctypes.c_void_p(alarm_action))
        raise_signal(signal.SIGABRT)  # pending until this returns: then the previous action receives it

    if _on_abort is None:
        os.register_at_fork(after_in_child=restore)
        _previous = _SigAction()
        libc.sigaction(signal.SIGABRT, None, ctypes.byref(_previous))
    _owner = os.getpid()
    _on_abort = handler_type(last_words)
    action = _SigAction()
    action.handler = ctypes.cast(_on_abort, ctypes.c_void_p)
    libc.sigaction(signal.SIGABRT, ctypes.byref(action), None)
