"""What a Python process does when its script ends, done by a worker whose job was its last.

A process of ``ppkit.spawn`` or ``%%torchrun`` runs one job and then ends, as a torchrun worker ends
when its script does. A forked worker leaves through ``os._exit``, which does none of what the
interpreter does at exit, so that is done here first, in the interpreter's order (``Py_FinalizeEx``):

1. ``threading._shutdown()``: the callbacks registered with ``threading._register_atexit`` (most
   recent first), then every non-daemon thread joined. ``concurrent.futures`` registers one that
   tells the workers of every ``ThreadPoolExecutor`` to stop once their queued work is done: a pool
   that a library keeps for the life of the process would otherwise wait for work for ever.
2. the ``atexit`` handlers (a logger's flush), most recent first.
"""

from __future__ import annotations

import atexit
import threading


def forget_inherited() -> None:
    """A forked worker starts with no ``atexit`` handlers of the fork server's: only what its own job
    registers runs at its end (the fork server's are for the fork server's own exit). The callbacks of
    ``threading._register_atexit`` stay: each is a module's, registered once at its import (as
    ``concurrent.futures.thread`` does), and stops that module's threads in this process too."""
    atexit._clear()


def run_exit_functions() -> None:
    """The interpreter's exit, from the main thread: ``threading._shutdown()`` (its atexit callbacks,
    then every non-daemon thread joined, including ones those start), then the atexit handlers (an
    error in one is printed and the next still runs)."""
    threading._shutdown()
    atexit._run_exitfuncs()
