"""Pickling by value (cloudpickle) that keeps each function's file name.

Tracebacks from a rank show the learner's source lines because the worker finds them by the code's
file name (a test file, or the cell's ``/tmp/ipykernel_.../N.py`` whose source the controller
ships alongside). cloudpickle 3.1.3 started to write every code object's file name as
``<dynamic-code>`` (to make its output deterministic), which turns those lines into
``File "<dynamic-code>", line 47``. ``dumps`` here is cloudpickle with that one field put back;
with older cloudpickle it changes nothing.
"""

from __future__ import annotations

import io
import types
from collections import ChainMap

import cloudpickle

_DYNAMIC = "<dynamic-code>"
_cloudpickle_code_reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)


def _code_reduce(code: types.CodeType):
    constructor, args = _cloudpickle_code_reduce(code)
    # co_name can never be "<dynamic-code>", so the only such top-level argument is the file name
    return constructor, tuple(code.co_filename if isinstance(a, str) and a == _DYNAMIC else a
                              for a in args)


class _Pickler(cloudpickle.Pickler):
    if _cloudpickle_code_reduce is not None:
        dispatch_table = ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    """``cloudpickle.dumps(obj)``, code objects keeping their file names."""
    with io.BytesIO() as buffer:
        _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
        return buffer.getvalue()


loads = cloudpickle.loads
