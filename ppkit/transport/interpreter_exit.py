"""What a Python process does when its script ends, done by a worker whose job was its last.

A process of ``ppkit.spawn`` or ``%%torchrun`` runs one job and then ends, as a torchrun worker ends
when its script does: the interpreter waits for the threads that are not daemons (an async
checkpoint's writer), then runs the ``atexit`` handlers (a logger's flush). A forked worker leaves
through ``os._exit``, which does neither, so they are run here first, in the interpreter's order.
"""

from __future__ import annotations

import atexit
import threading


def forget_inherited() -> None:
    """A forked worker starts with no handlers of the fork server's: only what its own job registers
    runs at its end (the fork server's are for the fork server's own exit)."""
    atexit._clear()


def run_exit_functions() -> None:
    """Wait for every non-daemon thread (including ones those start), then run the atexit handlers
    (most recently registered first; an error in one is printed and the next still runs)."""
    me = threading.current_thread()
    while waiting := [t for t in threading.enumerate() if t is not me and not t.daemon and t.is_alive()]:
        for thread in waiting:
            thread.join()
    atexit._run_exitfuncs()
