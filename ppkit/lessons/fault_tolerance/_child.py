"""What both child processes (the lighthouse, a replica) do first: die with the parent that started them.

Stdlib only: the children run as scripts, by path, so that they do not import ppkit (1.5 s) or, for the
lighthouse, torch (several seconds on a busy machine).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux), and also exit once the parent is gone (a watch
    thread covers the parent that died before prctl ran)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
