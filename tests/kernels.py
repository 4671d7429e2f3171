"""A real Jupyter kernel for a test module, and the check that nothing of ppkit's outlives it."""

from __future__ import annotations

from contextlib import contextmanager

import psutil
from jupyter_client.manager import start_new_kernel
from leftovers import ppkit_children, wait_gone


@contextmanager
def kernel_in(folder):
    """``(manager, client)`` of a python3 kernel whose working folder is ``folder``; at the end, every
    ppkit process it started is gone within 15 s of its shutdown."""
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(folder))
    try:
        yield km, kc
    finally:
        kernel_pid = km.provisioner.process.pid
        mine = {p.pid for p in psutil.Process(kernel_pid).children(recursive=True)}
        children = [p.pid for p in ppkit_children() if p.pid in mine]  # not other modules' kept fork servers
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        assert wait_gone(children, 15.0) == [], f"ppkit processes outlived the kernel (pid {kernel_pid})"
