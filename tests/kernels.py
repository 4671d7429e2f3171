"""A real Jupyter kernel for a test module, and the check that nothing of ppkit's outlives it."""

from __future__ import annotations

from contextlib import contextmanager

import psutil
from jupyter_client.manager import start_new_kernel
from leftovers import ppkit_children, wait_gone


@contextmanager
def kernel_in(folder=None, expect_processes: bool = False):
    """``(manager, client)`` of a python3 kernel whose working folder is ``folder``; at the end, every
    ppkit process it started is gone within 15 s of its shutdown (``expect_processes``: and it started some)."""
    km, kc = start_new_kernel(kernel_name="python3", **({"cwd": str(folder)} if folder is not None else {}))
    try:
        yield km, kc
    finally:
        kernel_pid = km.provisioner.process.pid
        mine = {p.pid for p in psutil.Process(kernel_pid).children(recursive=True)}
        children = [p.pid for p in ppkit_children() if p.pid in mine]  # not other modules' kept fork servers
        kc.stop_channels()
        km.shutdown_kernel(now=False)
        assert children or not expect_processes, f"the kernel (pid {kernel_pid}) started no ppkit process"
        assert wait_gone(children, 15.0) == [], f"ppkit processes outlived the kernel (pid {kernel_pid})"


@contextmanager
def kernel_after(folder, start: str, run_cell):
    """``kernel_in(folder)`` once ``start`` (a test module's first cell) ran there without an error."""
    with kernel_in(folder) as (km, kc):
        cell = run_cell(kc, start)
        assert cell.error is None, cell.text
        yield km, kc
