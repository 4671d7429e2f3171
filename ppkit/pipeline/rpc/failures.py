"""What an error that crossed RPC says, in one line.

torch wraps a remote exception in its own text ("Got the following error when running the
callback: ..."), and a stage adds its traceback (ppkit/pipeline/rpc/stage.py); the driver's messages
quote only the first line, and the whole text stays in the raised error's ``__cause__``.
"""

from __future__ import annotations

_NOISE = ("Got the following error when running the callback: ",)


def first_line(exc: BaseException) -> str:
    """The first line of an error that crossed RPC, without torch's wrapping."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    for noise in _NOISE:
        line = line.replace(noise, "")
    return line


def is_timeout(exc: BaseException) -> bool:
    """Whether an RPC failed because its answer did not come in time."""
    text = str(exc).lower()
    return "timeout" in text or "timed out" in text
