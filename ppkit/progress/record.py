"""The writer of the learner's progress record: append one event, rotate at the bound, under a lock.

    folder/record.jsonl       the current file, appended to
    folder/record.old.jsonl   the previous one: record.jsonl is renamed to it when an append would take
                              it past MAX_FILE_BYTES, so the two never hold much more than 512 KiB
    folder/OFF                present: nothing is written (``ppkit progress --off``)

Two kernels may append at once: each append takes an exclusive ``fcntl.flock`` on the file it opened
and, holding it, checks that this file is still the one at the path (another may have rotated it
meanwhile); a line is one ``write`` of at most 2 KiB in append mode. The folder is 0700 and the files
0600 whatever the umask, so other users of a shared machine cannot read them.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ppkit.progress import format as fmt

_OPEN_TRIES = 20  # another process rotating between our open and our lock makes us open again


def is_off(folder: Path | None = None) -> bool:
    """Whether recording is switched off: ``PPKIT_RECORD=off``, or the file ``OFF`` in the folder."""
    return fmt.switched_off_by_env() or ((folder or fmt.record_dir()) / fmt.OFF).exists()


def switch(on: bool, folder: Path | None = None) -> Path:
    """``ppkit progress --on`` / ``--off``: remove or make the ``OFF`` file; returns its path."""
    folder = folder or fmt.record_dir()
    flag = folder / fmt.OFF
    if on:
        flag.unlink(missing_ok=True)
    else:
        make_folder(folder)
        _private_file(flag).close()
    return flag


def make_folder(folder: Path) -> None:
    """The record's folder, made mode 0700 (also when it exists with looser bits: it is the record's)."""
    folder.mkdir(parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o777 != fmt.DIR_MODE:
        os.chmod(folder, fmt.DIR_MODE)


def event(kind: str, fields: dict) -> dict:
    """The line's object: the common fields, then ``fields`` (None values left out)."""
    if kind not in fmt.KINDS:
        raise ValueError(f"{kind!r} is not a kind of progress event; the kinds are {sorted(fmt.KINDS)}")
    missing = [name for name in fmt.KINDS[kind] if fields.get(name) is None]
    if missing:
        raise ValueError(f"a {kind!r} progress event needs {missing}; it got {sorted(fields)}")
    common = {"v": fmt.VERSION, "t": round(time.time(), 3), "kind": kind,
              "notebook": os.environ.get("JPY_SESSION_NAME") or None, "pid": os.getpid()}
    return {**common, **{k: v for k, v in fields.items() if v is not None and k not in common}}


def append(kind: str, folder: Path | None = None, **fields) -> Path | None:
    """Append one event to the record; the file written, or None when recording is off. Raises OSError
    when the folder cannot be written (``ppkit.progress.note`` turns that into one line on stderr)."""
    folder = folder or fmt.record_dir()
    if is_off(folder):
        return None
    line = fmt.encode(event(kind, fields))
    make_folder(folder)
    path = folder / fmt.CURRENT
    fd = _locked(path)
    try:
        if os.fstat(fd).st_size + len(line) > fmt.MAX_FILE_BYTES:
            os.replace(path, folder / fmt.OLD)  # still under the lock: others re-open the new file
            old, fd = fd, _locked(path)
            os.close(old)
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def _locked(path: Path) -> int:
    """A descriptor of the file now at ``path`` (made 0600 if new), opened for appending and locked."""
    for _ in range(_OPEN_TRIES):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, fmt.FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                if os.fstat(fd).st_mode & 0o777 != fmt.FILE_MODE:
                    os.fchmod(fd, fmt.FILE_MODE)  # the umask took bits off, or someone added some
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # rotated while we waited for the lock: take the new one
    raise OSError(f"{path} kept being replaced while ppkit waited to append to it ({_OPEN_TRIES} tries)")


def _same_file(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def _private_file(path: Path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, fmt.FILE_MODE)
    os.fchmod(fd, fmt.FILE_MODE)
    return os.fdopen(fd, "w")
