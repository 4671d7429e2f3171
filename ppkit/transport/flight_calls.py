"""What a rank's calls say that torch's flight record does not, kept as the learner makes them.

torch's record (flight_record.py) holds what the backend ran: gloo records a list-form
``reduce_scatter`` as one all_reduce per piece, no reduce op, no tag, and none of its send/recv.
So, on each rank, ppkit keeps beside it, from the Python side of torch.distributed:

- each collective's API name (``reduce_scatter``), reduce op, root, the learner's frames, and the
  sequence numbers it took in the backend's count (read before and after the call), matched to
  torch's entries by group and sequence number (``api_calls``);
- each point-to-point call with its peer, tag, sizes and Work (gloo's are not in torch's record), and
  its number among this rank's calls of that kind to that peer with that tag (``n``): gloo pairs a
  pair's sends and recvs of one tag in the order they are posted, so the n-th send from A to B meets
  B's n-th recv from A (``p2p_posted`` counts them; a recv from any source breaks the count, and says
  so). The completed ones are kept too, without their tensors (``p2p_done``), and whether a wait on
  one raised;
- an all_to_all_single's split sizes (elements to and from each rank): the record keeps only its
  whole tensors;
- which Work (or Future) the main thread waits on: a rank in ``req.wait()`` is blocked, one in
  its own code with a call pending is not;
- when each process group was created (``born_ns``): torch's record outlives
  ``destroy_process_group``, and a new group gets the same name with sequence numbers from 1.

The methods torch's P2POp compares by identity (``dist.isend``...) are left as they are: ppkit
wraps ProcessGroup's methods, which every path reaches.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

from ppkit.transport.flight_frames import is_learners, torch_dir
from ppkit.transport.flight_p2p import P2PCall, _posted, failed_works, global_rank, keep_p2p, p2p_posted, p2p_ring

API_KEEP = 256  # collectives' API records kept: more than the KEEP calls per group sent to the kernel
P2P = ("send", "recv", "recv_anysource")
COLLECTIVES = ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
               "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single",
               "all_gather_single_coalesced", "gather", "gather_into_tensor", "gather_single", "scatter",
               "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single", "reduce_scatter_single_coalesced",
               "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "all_to_all_single", "barrier")
_posting = threading.Lock()  # a call's number and its posting in the backend happen together
api_ring: collections.deque = collections.deque(maxlen=API_KEEP)  # (group, backend, first, last, api, op, root,
#                                                                     frames, splits)
raised_calls: collections.deque = collections.deque(maxlen=4)  # collectives that raised before the backend
#                                                                   ran them (_keep_raised)
born_ns: dict[str, int] = {}  # group name -> when its present (or last) lifetime began (time.time_ns, as torch's)
p2p_counted: dict[tuple[str, str], int] = {}  # (group, backend) -> sequence numbers its send/recv took (gloo's do)
waiting: dict[int, object] = {}  # thread ident -> the Work it waits on


def watch() -> None:
    """Wrap ProcessGroup's collectives and point-to-point calls, Work.wait and group creation (once)."""
    try:
        from torch._C._distributed_c10d import ProcessGroup, Work
        from torch.distributed import distributed_c10d
    except ImportError:  # a torch built without distributed
        return
    for name in P2P + COLLECTIVES:
        original = getattr(ProcessGroup, name, None)
        if original is not None and not getattr(original, "ppkit_watched", False):
            setattr(ProcessGroup, name, (_watched_p2p if name in P2P else _watched_collective)(name, original))
    from torch._C import Future

    for waitable in (Work, Future):  # req.wait(), and req.get_future().wait()
        if not getattr(waitable.wait, "ppkit_watched", False):
            waitable.wait = _watched_wait(waitable.wait)
    helper = getattr(distributed_c10d, "_new_process_group_helper", None)
    if helper is not None and not getattr(helper, "ppkit_watched", False):
        distributed_c10d._new_process_group_helper = _watched_creation(helper)


def _watched(call):
    call.ppkit_watched = True
    return call


def _watched_p2p(name: str, original):
    def call(group, tensors, *args, **kwargs):
        backend, before = _count(group, (tensors,))
        with _posting:  # two threads' calls to one peer: numbered in the order the backend posts them
            work = original(group, tensors, *args, **kwargs)  # as called: keywords (dstRank=, srcRank=, tag=) too
            key, n = _posted(group, name, args, kwargs) if work is not None else (None, 0)
        try:
            if backend is not None:  # gloo counts a send/recv in the sequence number, the record's count does not
                taken = backend._get_sequence_number_for_group() - before
                if taken > 0:
                    counted = (str(group.group_name), _backend_name(backend))
                    p2p_counted[counted] = p2p_counted.get(counted, 0) + taken
            if key is not None:
                group_name, op, peer, tag = key
                frames = call_site(sys._getframe(1), name)[1]
                keep_p2p(P2PCall(op, peer, [list(t.shape) for t in tensors],
                                 str(tensors[0].dtype).replace("torch.", "") if tensors else "", tag, frames,
                                 group_name, n, sum(t.numel() * t.element_size() for t in tensors), work,
                                 born=born_ns.get(group_name, 0)))
        except Exception:  # noqa: BLE001 - the record is a diagnosis; it never fails the call
            pass
        return work

    return _watched(call)


def _watched_collective(name: str, original):
    def call(group, *args, **kwargs):
        backend, before = _count(group, args)
        try:
            work = original(group, *args, **kwargs)
        except Exception as exc:  # the backend refused the call (gloo checks sizes): no entry in torch's record
            _keep_raised(group, backend, before, name, args, kwargs, exc, sys._getframe(1))
            raise
        try:
            after = backend._get_sequence_number_for_group() if backend is not None else before
            if after is not None and after > before:
                api, frames = call_site(sys._getframe(1), name)
                key = (str(group.group_name), _backend_name(backend))
                p2p = p2p_counted.get(key, 0)  # the record counts collectives only
                api_ring.append((key[0], key[1], before + 1 - p2p, after - p2p,
                                 api, _reduce_op(args, kwargs), _root(group, args, kwargs), frames,
                                 _splits(group, args) if name in ("all_to_all_single", "alltoall_base") else None))
        except Exception:  # noqa: BLE001 - the record is a diagnosis; it never fails the call
            pass
        return work

    return _watched(call)


def _keep_raised(group, backend, before, name: str, args, kwargs, exc: Exception, frame) -> None:
    """A collective that raised as the learner called it, before the backend ran it (so torch's record has
    no entry): its group, the number it would have taken, the learner's call and inputs, and the error."""
    try:
        api, frames = call_site(frame, name)
        key = (str(group.group_name), _backend_name(backend) if backend is not None else "")
        sizes, dtypes = _api_inputs(frame, api)
        raised_calls.append({"group": key[0], "backend": key[1], "api": api, "frames": frames,
                             "seq": (before or 0) + 1 - p2p_counted.get(key, 0), "reduce_op": _reduce_op(args, kwargs),
                             "root": _root(group, args, kwargs), "input_sizes": sizes, "input_dtypes": dtypes,
                             "error": f"{type(exc).__name__}: {exc}", "time_ns": time.time_ns(),
                             "born": born_ns.get(key[0], 0)})
    except Exception:  # noqa: BLE001 - the record is a diagnosis; it never changes the learner's error
        pass


INPUTS = ("input_tensor", "input", "tensor", "input_list", "input_tensor_list")  # distributed_c10d's names
SCALAR_TYPES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
                "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
                "complex64": "ComplexFloat", "complex128": "ComplexDouble"}  # as torch's record names dtypes


def _api_inputs(frame, api: str) -> tuple[list, list]:
    """The input tensors' sizes and dtypes of the torch.distributed call ``api`` (its frame's arguments), as
    torch's record gives them ([[3]], ["Float"]); empty where its frame is not found."""
    while frame is not None and not (frame.f_code.co_name == api
                                     and frame.f_code.co_filename.endswith("distributed_c10d.py")):
        frame = frame.f_back
    if frame is None:
        return [], []
    value = next((frame.f_locals[name] for name in INPUTS if frame.f_locals.get(name) is not None), None)
    tensors = [value] if hasattr(value, "shape") else [t for t in value or [] if hasattr(t, "shape")]
    dtypes = [str(t.dtype).replace("torch.", "") for t in tensors]
    return [list(t.shape) for t in tensors], [SCALAR_TYPES.get(d, d) for d in dtypes]


def _count(group, args):
    """The backend that runs a call and its sequence number before it (None, None: a backend without one)."""
    try:
        backend = _backend(group, args)
        return backend, backend._get_sequence_number_for_group()
    except Exception:  # noqa: BLE001 - a backend without a count: its calls go unnamed
        return None, None


def _watched_wait(original):
    def wait(work, *args, **kwargs):
        ident = threading.get_ident()
        waiting[ident] = work
        try:
            return original(work, *args, **kwargs)
        except BaseException:
            if any(call.work is work for call in list(p2p_ring)):
                failed_works.add(id(work))
            raise
        finally:
            waiting.pop(ident, None)

    return _watched(wait)


def _watched_creation(original):
    def helper(*args, **kwargs):
        began = time.time_ns()  # before: every entry of the new group is created after this
        made = original(*args, **kwargs)
        try:
            name = str(made[0].group_name)
            born_ns[name] = began
            for counts in (p2p_counted, p2p_posted):  # the new group counts from 1
                for key in [key for key in counts if key[0] == name]:
                    del counts[key]
            kept = [call for call in api_ring if call[0] != name]  # the earlier group's calls of this name
            api_ring.clear()
            api_ring.extend(kept)
        except (AttributeError, IndexError, TypeError):  # a rank outside the group: GroupMember.NON_GROUP_MEMBER
            pass
        return made

    return _watched(helper)


def _backend(group, args):
    """The backend that runs a call: the one for its tensors' device ('cpu:gloo,cuda:nccl' has two)."""
    tensor = _first_tensor(args)
    if tensor is not None:
        try:
            return group._get_backend(tensor.device)
        except RuntimeError:
            pass
    return group


def _first_tensor(value, depth: int = 0):
    if hasattr(value, "device") and hasattr(value, "shape"):
        return value
    if isinstance(value, (list, tuple)) and depth < 3:
        for item in value:
            found = _first_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


def _backend_name(backend) -> str:
    try:
        return str(backend.name()).lower()
    except Exception:  # noqa: BLE001 - a ProcessGroup stands in for its backend: named by torch's entry
        return ""


def _splits(group, args) -> list[list[int]] | None:
    """An all_to_all_single's elements to and from each rank: [[global rank, sent to it, received from it]...]
    (args: output, input, output_split_sizes, input_split_sizes, options; empty sizes split evenly)."""
    try:
        output, input_, out_split, in_split = args[:4]
        size = group.size()

        def per_rank(tensor, split):
            rows = list(split) or [tensor.shape[0] // size] * size
            row = tensor.numel() // tensor.shape[0] if tensor.shape[0] else 0
            return [r * row for r in rows]

        sent, received = per_rank(input_, in_split), per_rank(output, out_split)
        return [[global_rank(group, j), sent[j], received[j]] for j in range(size)]
    except Exception:  # noqa: BLE001 - the record is a diagnosis; it never fails the call
        return None


def call_site(frame, method: str) -> tuple[str, list[tuple[str, int, str]]]:
    """The torch.distributed function the learner called (the outermost of distributed_c10d's frames
    in the run of torch.distributed's frames the call starts in), and the frames from the call out to
    the learner's, innermost first. It stops at the learner's frame: its cost does not grow with the
    depth of the learner's own stack."""
    api, frames, inside = method, [], True
    distributed = os.path.join(torch_dir(), "distributed")
    while frame is not None:
        filename = frame.f_code.co_filename
        frames.append((filename, frame.f_lineno, frame.f_code.co_name))
        if inside and (filename.startswith(distributed) or filename == __file__):  # this module's wrappers too
            if filename.endswith("distributed_c10d.py"):
                api = frame.f_code.co_name
        else:
            inside = False
            if is_learners(filename):
                break
        frame = frame.f_back
    return api, frames


def _reduce_op(args, kwargs) -> str:
    for value in (*args, *kwargs.values()):
        op = getattr(value, "reduceOp", None)
        if op is not None:
            kind = getattr(op, "op", op)
            return str(getattr(kind, "name", kind))
    return ""


def _root(group, args, kwargs) -> int | None:
    """The root of a broadcast, reduce, gather or scatter, as a global rank (its options' rootRank)."""
    for value in (*args, *kwargs.values()):
        root = getattr(value, "rootRank", None)
        if isinstance(root, int):
            return global_rank(group, root)
    return None
