"""What a Python process does when its script ends, done by a worker whose job was its last.

A process of ``ppkit.spawn`` or ``%%torchrun`` runs one job and then ends, as a torchrun worker ends
when its script does. A forked worker leaves through ``os._exit``, which does none of what the
interpreter does at exit, so that is done here first, in the interpreter's order (``Py_FinalizeEx``):

1. ``threading._shutdown()``: the callbacks registered with ``threading._register_atexit`` (most
   recent first), then every non-daemon thread joined. ``concurrent.futures`` registers one that
   tells the workers of every ``ThreadPoolExecutor`` to stop once their queued work is done: a pool
   that a library keeps for the life of the process would otherwise wait for work for ever. An error
   there is printed as the interpreter prints it ("Exception ignored in: <module 'threading'>") and the
   exit goes on.
2. the ``atexit`` handlers, most recent first: the job's own and those the standard library and torch
   registered when the fork server imported them (``logging.shutdown`` flushes a ``MemoryHandler``,
   multiprocessing joins its non-daemon children), as a script that imports them runs them. ppkit's own
   kernel-side handlers do nothing in a worker: they stop the clusters and the spare fork server that
   their own process started (``cluster/controller.py``, ``cluster/launchers/spare.py``), and a fork
   server starts neither.

While step 1 waits for a thread, ``waiting_for()`` names it, so that a rank that never ends says which
thread it waits for (the worker's answer to the controller's question "where are you?").
"""

from __future__ import annotations

import atexit
import sys
import threading
import traceback

_exiting = threading.Event()
RETURNED = "fn returned; the process waits, as Python does at exit, for non-daemon thread"  # waiting_for()'s start


def run_exit_functions() -> None:
    """The interpreter's exit, from the main thread: ``threading._shutdown()`` (its atexit callbacks,
    then every non-daemon thread joined, including ones those start), then the atexit handlers (an
    error in either is printed and the exit goes on, as the interpreter does)."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"ppkit: run_exit_functions() was called from thread {threading.current_thread().name!r}: it joins "
            "every non-daemon thread, that one included, so it would wait for itself for ever. Call it from the "
            "main thread, as the interpreter does at exit.")
    _exiting.set()
    try:
        threading._shutdown()
    except BaseException as exc:  # noqa: BLE001 - the interpreter reports it and goes on (wait_for_thread_shutdown)
        _report_unraisable(exc, threading)
    atexit._run_exitfuncs()


def waiting_for() -> str:
    """While the exit waits: each live non-daemon thread other than the main one, by name, with where it is
    (its innermost frame and its stack); "" when the process is not exiting or waits for none."""
    if not _exiting.is_set():
        return ""
    frames = sys._current_frames()
    parts = []
    for thread in threading.enumerate():
        if thread.daemon or thread is threading.main_thread() or not thread.is_alive():
            continue
        frame = frames.get(thread.ident)
        stack = traceback.extract_stack(frame) if frame is not None else []
        where = f" at {stack[-1].filename}:{stack[-1].lineno}" if stack else ""
        parts.append(f"{RETURNED} {thread.name!r}{where}; make it daemon=True or stop it before fn returns.\n"
                     + "".join(traceback.format_list(stack)))
    return "\n".join(parts)


def _report_unraisable(exc: BaseException, obj) -> None:
    """``sys.unraisablehook`` with the interpreter's own arguments (it takes no other type), so the default
    hook prints "Exception ignored in: <obj>" and the traceback, as at a script's exit."""
    try:
        args = _unraisable_args_type()((type(exc), exc, exc.__traceback__, None, obj))
        sys.unraisablehook(args)
    except Exception:  # noqa: BLE001 - a broken hook: the interpreter's words, printed here
        print(f"Exception ignored in: {obj!r}", file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__)


def _unraisable_args_type() -> type:
    """``UnraisableHookArgs``, which CPython does not name: the type of what a failing ``__del__`` hands the hook."""
    seen: list = []

    class _Raises:
        def __del__(self):
            raise RuntimeError("ppkit: the interpreter's UnraisableHookArgs, looked up")

    hook, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        _Raises()
    finally:
        sys.unraisablehook = hook
    return type(seen[0])
