"""The rank's last words as gloo aborts the process: a C-level SIGABRT handler that sends the flight
record (flight_record.py) before the abort goes on."""

from __future__ import annotations

import ctypes
import os
import signal

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
