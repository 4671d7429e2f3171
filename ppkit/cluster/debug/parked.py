"""The rank that raised in a ppkit.spawn / %%torchrun call, kept for ``%debug`` in the next cell.

Under torchrun a failed rank's process is gone, and with it its frames. Here, in IPython, the rank
that raised stays (its process parked, the other ranks stopped as torchrun's agent stops them) until
the end of the cell after the failing one, or ``PARK_S`` seconds, or the next call that needs its
processes: ``%debug`` then opens pdb in its frame, with its locals (post_mortem.py). One call's ranks
are kept at a time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

PARK_S = 300.0  # the longest a failed rank waits for a %debug
_lock = threading.Lock()
_parked: list[Parked] = []  # at most one
_hooked: set[int] = set()  # the IPython shells whose post_run_cell releases it


@dataclass
class Parked:
    cluster: object  # the hidden Cluster whose ranks these are
    ranks: tuple[int, ...]
    generation: int  # the cluster's worker generation then: a later call's workers are never stopped
    error: BaseException | None = None  # the error raised in the cell, once the caller has it
    cells_left: int = 2  # post_run_cell events until release: the failing cell's, then the next one's


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def can_park() -> bool:
    """Only where a learner can type ``%debug`` next: a Jupyter kernel, or IPython in a terminal. Not a
    bare ``InteractiveShell`` that a program or a test made (no next cell comes to release the rank)."""
    shell = _shell()
    return getattr(shell, "kernel", None) is not None or type(shell).__name__ == "TerminalInteractiveShell"


def park(cluster, ranks: tuple[int, ...]) -> Parked:
    """Keep ``ranks`` of ``cluster`` (already the only ranks left running) until released."""
    release()
    shell = _shell()
    entry = Parked(cluster, tuple(ranks), cluster.generation)
    with _lock:
        _parked.append(entry)
    if shell is not None and id(shell) not in _hooked:
        shell.events.register("post_run_cell", _after_cell)
        _hooked.add(id(shell))
    timer = threading.Timer(PARK_S, _release_entry, args=(entry,))
    timer.daemon = True
    timer.start()
    return entry


def find(error: BaseException):
    """``(cluster, rank)`` to open a post-mortem on for ``error``, or None (released, or another error)."""
    with _lock:
        for entry in _parked:
            if entry.error is error and entry.cluster.generation == entry.generation:
                return entry.cluster, entry.ranks[0]
    return None


def release() -> None:
    """Stop the parked rank now (the next call on its processes, or the kernel's end, does this)."""
    with _lock:
        entries = list(_parked)
    for entry in entries:
        _release_entry(entry)


def _release_entry(entry: Parked) -> None:
    with _lock:
        if entry not in _parked:
            return
        _parked.remove(entry)
    entry.cluster.stop_kept(entry.generation)


def _after_cell(*_result) -> None:
    with _lock:
        due = [entry for entry in _parked if entry.cells_left <= 1]
        for entry in _parked:
            entry.cells_left -= 1
    for entry in due:
        _release_entry(entry)
