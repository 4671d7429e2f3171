"""The writer of the learner's progress record: append one event, rotate at the bound, under a lock.

    folder/record.jsonl       the current file, appended to
    folder/record.old.jsonl   the previous one: record.jsonl is renamed to it when an append would take
                              it past MAX_FILE_BYTES, so the two never hold much more than 512 KiB
    folder/OFF                present: nothing is written (``ppkit progress --off``)

The folder is settled first, once per process (place.py: the link under a Jupyter root, what moves in);
files.py appends under a lock, rotates, and keeps the folder 0700 and the files 0600.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ppkit.progress import format as fmt
from ppkit.progress import place
from ppkit.progress.files import append_lines, make_folder, private_file


def is_off(folder: Path | None = None) -> bool:
    """Whether recording is switched off: ``PPKIT_RECORD=off``, or the file ``OFF`` in the folder."""
    return fmt.switched_off_by_env() or ((folder or fmt.record_dir()) / fmt.OFF).exists()


def switch(on: bool, folder: Path | None = None) -> Path:
    """``ppkit progress --on`` / ``--off``: remove or make the ``OFF`` file; returns its path."""
    folder = place.settle(folder or fmt.record_dir())
    flag = folder / fmt.OFF
    if on:
        flag.unlink(missing_ok=True)
    else:
        make_folder(folder)
        private_file(flag).close()
    return flag


def event(kind: str, fields: dict) -> dict:
    """The line's object: the common fields, then ``fields`` (None values left out)."""
    if kind not in fmt.KINDS:
        raise ValueError(f"{kind!r} is not a kind of progress event; the kinds are {sorted(fmt.KINDS)}")
    missing = [name for name in fmt.KINDS[kind] if fields.get(name) is None]
    if missing:
        raise ValueError(f"a {kind!r} progress event needs {missing}; it got {sorted(fields)}")
    common = {"v": fmt.VERSION, "t": round(time.time(), 3), "kind": kind,
              "notebook": session_path(os.environ.get("JPY_SESSION_NAME")), "pid": os.getpid()}
    return {**common, **{k: v for k, v in fields.items() if v is not None and k not in common}}


def session_path(name: str | None) -> str | None:
    """The kernel's notebook as its server's /api/sessions names it: jupyter_server gives a kernel JPY_SESSION_NAME
    as the path on disk, kept relative to the server's root when it lies under it (else as it is)."""
    if not name:
        return None
    root = fmt.jupyter_root()
    if root is not None and os.path.isabs(name):
        for path in (Path(name), Path(name).resolve()):
            if path.is_relative_to(root):
                return path.relative_to(root).as_posix()
    return name


def append(kind: str, folder: Path | None = None, **fields) -> Path | None:
    """Append one event to the record; the file written, or None when recording is off. Raises OSError
    when the folder cannot be written (``ppkit.progress.note`` turns that into one line on stderr)."""
    folder = place.settle(folder or fmt.record_dir())
    if is_off(folder):
        return None
    return append_lines(folder, fmt.encode(event(kind, fields)))
