"""RPC's pickler, taught to send what a notebook cell defines by value.

torch's RPC pickles functions and classes *by reference* (module + name). A worker's ``__main__``
is ppkit's fork server, not the notebook, so ``rpc.remote("worker1", ResNetShard1)`` fails there,
and so does the owner sending an object's type back (``rref.remote().m()`` asks for it). Here,
while a ppkit RPC world runs, every process (kernel and workers) pickles a function or class
*by value* (with cloudpickle) when its module is ``__main__`` or when it cannot be found by its
name (a lambda, a function defined inside another). cloudpickle gives a class the same identity
each time it arrives, so instances sent back and forth keep one class.

It hooks private details of ``torch.distributed.rpc.internal``: the ``_pickler`` class that
``_InternalRPCPickler.serialize`` instantiates, and that instance's ``serialize`` (to turn "cannot
pickle" into a ``ppkit.RpcPickleError`` naming the object, the call and what to do) and
``deserialize`` (so a received call notes what it returned, for that message).
``require_torch_internals`` checks that they exist, before any process starts, and says so if a
torch release moved them.
"""

from __future__ import annotations

import pickle
import sys
import threading
import types

from ppkit import compat
from ppkit.compat import TESTED_RANGE
from ppkit.errors import ClusterStateError, RpcPickleError
from ppkit.transport import byvalue

_installed: dict | None = None  # the torch originals while installed
# thread id -> (id(result), call) of what the last call run on that thread returned. Not a
# threading.local: RPC's C++ threads get a fresh Python thread state each time they take the GIL.
_last_result: dict[int, tuple[int, str]] = {}
_MAX_DEPTH = 8


def ships_by_value(obj) -> bool:
    """Whether RPC should send this function or class by value: another process cannot import it."""
    if not isinstance(obj, (type, types.FunctionType)):
        return False
    module_name = getattr(obj, "__module__", None)
    if module_name == "__main__":
        return True
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if module is None:
        return False  # leave it to pickle, which imports the module on the other side
    found = module
    for part in getattr(obj, "__qualname__", "").split("."):
        found = getattr(found, part, None)  # "<locals>" and "<lambda>" are never attributes
        if found is None:
            return True
    return found is not obj


class MainByValuePickler(pickle.Pickler):
    """``pickle.Pickler`` (torch's dispatch table still applies) plus by-value for cell code."""

    def reducer_override(self, obj):
        if ships_by_value(obj):
            return byvalue.loads, (byvalue.dumps(obj),)
        return NotImplemented


def require_torch_internals():
    """``torch.distributed.rpc.internal``, or a ClusterStateError naming what this torch lacks."""
    from torch.distributed.rpc import internal

    missing = [name for name in ("_pickler", "_internal_rpc_pickler", "PythonUDF",
                                 "RemoteException") if not hasattr(internal, name)]
    if not missing:
        missing = [f"_internal_rpc_pickler.{name}" for name in ("serialize", "deserialize")
                   if not callable(getattr(internal._internal_rpc_pickler, name, None))]
    if missing:
        import torch

        raise ClusterStateError(
            f"ppkit's RPC world cannot start on torch {torch.__version__}: it has no "
            f"torch.distributed.rpc.internal.{', '.join(missing)}, which ppkit replaces so that RPC "
            f"sends functions and classes defined in a notebook cell by value. ppkit is tested with "
            f"{TESTED_RANGE}: install one of those (pip install 'torch==2.14.1' "
            "'torchvision==0.29.1'), or report the torch version.")
    return internal


def install() -> None:
    """Make this process's RPC pickler send cell code by value. Idempotent."""
    global _installed
    if _installed is not None:
        return
    internal = require_torch_internals()
    original_serialize = internal._internal_rpc_pickler.serialize
    original_deserialize = internal._internal_rpc_pickler.deserialize
    _installed = {"pickler": internal._pickler}

    def serialize(obj):
        try:
            return original_serialize(obj)
        except Exception as exc:  # noqa: BLE001  (whatever pickling raised, reported as one error)
            error = RpcPickleError(_explain(obj, exc, original_serialize, internal.PythonUDF))
            if isinstance(obj, internal.PythonUDF):
                raise error from exc  # the caller's own thread: rpc_sync/rpc_async/remote raise it
            # A result (or an RRef's value) on the callee: send the error back instead, so the
            # caller raises it rather than torch's "failed to serialize" with C++ frames.
            return original_serialize(internal.RemoteException(str(error), RpcPickleError))

    def deserialize(binary_data, tensor_table):
        obj = original_deserialize(binary_data, tensor_table)
        if isinstance(obj, internal.PythonUDF):  # a call to run here: remember its name
            obj = obj._replace(func=_NamedCall(obj.func, _describe_call(obj)[0]))
        return obj

    internal._pickler = MainByValuePickler
    internal._internal_rpc_pickler.serialize = serialize
    internal._internal_rpc_pickler.deserialize = deserialize


class _NamedCall:
    """A received call's function that notes what it returned, so that a result that cannot be
    pickled (on this thread, right after) is reported with the call that made it."""

    def __init__(self, func, call: str):
        self.func = func
        self.call = call

    def __call__(self, *args, **kwargs):
        result = self.func(*args, **kwargs)
        _last_result[threading.get_ident()] = (id(result), self.call)
        return result


def uninstall() -> None:
    """Give torch its own pickler back (after RPC shut down). Idempotent."""
    global _installed
    if _installed is None:
        return
    from torch.distributed.rpc import internal

    internal._pickler = _installed["pickler"]
    internal._internal_rpc_pickler.__dict__.pop("serialize", None)
    internal._internal_rpc_pickler.__dict__.pop("deserialize", None)
    _last_result.clear()
    _installed = None


def installed() -> bool:
    return _installed is not None


# -- the error message ---------------------------------------------------------------------------
def _explain(obj, exc: Exception, serialize, python_udf) -> str:
    from torch.distributed import rpc

    here = rpc.get_worker_info().name if compat.rpc_agent_running() else "this process"
    if isinstance(obj, python_udf):
        call, root, path, rref = _describe_call(obj)
        if rref is not None:
            call += f" to {rref.owner().name}"
        what = f"{here} could not send the call {call}"
    else:
        root, path = obj, "the value"
        last = _last_result.get(threading.get_ident())
        what = (f"{here} could not send back the result of {last[1]}" if last and last[0] == id(obj)
                else f"{here} could not send back a value (an RPC's result or an RRef's value)")
    culprit, where = _culprit(root, path, serialize)
    return (f"{what}: {where} is {_short(culprit)}, which cannot be pickled "
            f"({type(exc).__name__}: {exc}). Objects such as locks, open files and generators "
            "cannot travel between processes: create them where they are used (in the __init__ "
            "of the class that rpc.remote builds on the worker, or inside the function), or send "
            "what they are made from (a file name instead of an open file, a list instead of a "
            "generator).")


def _describe_call(udf) -> tuple[str, object, str, object]:
    """The call as the user wrote it, what to search for the culprit, and the RRef of a helper."""
    name = getattr(udf.func, "__qualname__", None) or repr(udf.func)
    helper = name.startswith("_local_invoke") and isinstance(udf.args, tuple)
    if helper and len(udf.args) == 4:  # an RRef helper, rref.x().m(): (rref, "m", args, kwargs)
        rref, method, args, kwargs = udf.args
        return f"rref.<rpc_sync|rpc_async|remote>().{method}(...)", (args, kwargs), "argument", rref
    return f"{name}(...)", (udf.func, udf.args, udf.kwargs or {}), "argument", None


def _culprit(root, path: str, serialize):
    """The innermost part of ``root`` that does not pickle, with a readable path to it."""
    from torch.distributed.rpc import PyRRef

    def picklable(value) -> bool:
        if isinstance(value, PyRRef):
            return True  # pickling an RRef registers a fork with its owner: never do it idly
        try:
            serialize(value)
        except Exception:  # noqa: BLE001
            return False
        return True

    if path == "argument":  # (func, args, kwargs) or (args, kwargs)
        *func, args, kwargs = root
        parts = [("the function", f) for f in func]
        if isinstance(args, (tuple, list)):
            parts += [(f"argument {i}", a) for i, a in enumerate(args)]
        else:  # never iterate it: it may be a generator
            parts.append(("args=", args))
        if isinstance(kwargs, dict):
            parts += [(f"keyword argument {k}", v) for k, v in kwargs.items()]
        else:
            parts.append(("kwargs=", kwargs))
        for where, value in parts:
            if not picklable(value):
                return _culprit(value, where, serialize)
        return root, "one of the arguments"
    seen: set[int] = set()
    value = root
    for _ in range(_MAX_DEPTH):
        seen.add(id(value))
        for child_path, child in _children(value, path):
            if id(child) not in seen and not picklable(child):
                value, path = child, child_path
                break
        else:
            break
    return value, path


def _children(value, path: str):
    if isinstance(value, (list, tuple)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return [(f"{path}[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (type, types.FunctionType, types.ModuleType)):
        return []
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict):
        children = []
        for key, child in state.items():
            if key in ("_parameters", "_buffers", "_modules") and isinstance(child, dict):
                children += [(f"{path}.{k}", v) for k, v in child.items()]  # nn.Module's own
            else:
                children.append((f"{path}.{key}", child))
        return children
    return []


def _short(value) -> str:
    kind = type(value)
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"a {kind.__module__}.{kind.__qualname__} ({text})"
