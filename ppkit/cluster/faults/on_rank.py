"""A fault on its rank: ``ppkit.step(i)`` in the training loop, and the wrapper each job of a run with an
armed fault runs in (arming.py). A kill is the process's own signal (``os.kill`` of itself), so that it ends
as a rank the scheduler or the out-of-memory killer ends; a raise is an exception from the loop's own line;
a hang sleeps for ever, as a rank stuck outside the collectives does, until a timeout or Kernel > Interrupt."""

from __future__ import annotations

import os
import threading
import time

from ppkit.cluster.faults.plan import Fault

_armed: Fault | None = None  # this process's fault, while a job that carries it runs


class InjectedFailure(RuntimeError):
    """What a rank raises when ``ppkit.fail_rank(rank, how="raise")`` makes it fail."""


def step(i: int) -> None:
    """Say that the training loop is at step ``i``: where ``ppkit.fail_rank(rank, at_step=N)`` makes a rank
    fail once ``i`` reaches N. Costs nothing otherwise, and does nothing outside a rank.

    >>> for i, batch in enumerate(loader):
    ...     ppkit.step(i)
    ...     loss = train_step(batch)
    """
    fault = _armed
    if fault is not None and fault.at_step is not None and i >= fault.at_step:
        _fail(fault, f"at step {i}")


def with_fault(fault: Fault, fn, rank: int, *args, **kwargs):
    """``fn(rank, *args, **kwargs)`` (a job of the run) with ``fault`` armed on its rank."""
    global _armed
    if rank != fault.rank:
        return fn(rank, *args, **kwargs)
    timer = None
    if fault.at_step is None and fault.after is None:
        _fail(fault, "as its run started")
    elif fault.after is not None:
        timer = threading.Timer(fault.after, os.kill, (os.getpid(), fault.signal))
        timer.daemon = True
        timer.start()
    _armed = fault
    try:
        return fn(rank, *args, **kwargs)
    finally:
        _armed = None
        if timer is not None:
            timer.cancel()


def _fail(fault: Fault, where: str) -> None:
    if fault.how == "kill":
        os.kill(os.getpid(), fault.signal)  # a signal the process handles (SIGINT, SIGUSR1 caught) lets it go on
        return
    if fault.how == "raise":
        raise InjectedFailure(f"rank {fault.rank} failed {where}, on purpose: {fault.describe()}")
    while True:  # how == "hang"
        time.sleep(0.1)
