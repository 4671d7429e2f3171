"""What a job is on the wire: the function and its arguments pickled by value, and the notebook cells' source
that the ranks have not had yet (so that their tracebacks show the cell's lines)."""

from __future__ import annotations

import linecache

from ppkit.errors import ConfigError
from ppkit.transport import byvalue
from ppkit.transport.messages import CellSource


def new_cell_sources(sent: set[str]) -> tuple[CellSource, ...]:
    """Notebook cells' source the workers have not had yet (``sent`` names those they have).

    IPython keeps each cell's code in ``linecache`` only (mtime None), not on disk; without it
    a remote traceback or stack would name the cell's line but not show it.
    """
    # a full entry is (size, mtime, lines, fullname); a lazy one (a module's, not read yet) has one item
    new = tuple(CellSource(name, "".join(entry[2])) for name, entry in list(linecache.cache.items())
                if len(entry) == 4 and entry[1] is None and name not in sent)
    sent.update(cell.filename for cell in new)
    return new


def check_job_function(fn) -> None:
    if not callable(fn):
        raise ConfigError(
            f"run() needs a function to call on every rank, got {type(fn).__name__} "
            f"{fn!r:.60}. Pass the function itself: cluster.run(my_fn), not cluster.run(my_fn()).")


def pack_job(fn, args: tuple, kwargs: dict) -> bytes:
    """``fn`` and its arguments pickled by value, as every rank will unpickle them."""
    try:
        return byvalue.dumps((fn, args, kwargs))
    except Exception as exc:
        raise ConfigError(
            f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments to the workers: "
            f"{exc}. Pass data (tensors, numbers, lists), not open files, locks or "
            "process handles.") from exc
