"""The record's files on disk: its folder (0700), a locked append that rotates at the bound, a private file.

Two kernels may append at once: each append takes an exclusive ``fcntl.flock`` on the file it opened and, holding
it, checks that this file is still the one at the path (another may have rotated it meanwhile); a line is one
``write`` of at most 2 KiB in append mode. The folder is 0700 and the files 0600 whatever the umask, so other users
of a shared machine cannot read them. record.py (the writer) and place.py (what moves in once) use these.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ppkit.progress import format as fmt

_OPEN_TRIES = 20  # another process rotating between our open and our lock makes us open again


def make_folder(folder: Path) -> None:
    """The record's folder, made mode 0700 (also when it exists with looser bits: it is the record's)."""
    folder.mkdir(parents=True, exist_ok=True)
    if folder.stat().st_mode & 0o777 != fmt.DIR_MODE:
        os.chmod(folder, fmt.DIR_MODE)


def append_lines(folder: Path, line: bytes) -> Path:
    """Append ``line`` (one or more whole lines) to ``folder``'s record.jsonl, rotating it first when the append
    would take it past the bound; the file written."""
    make_folder(folder)
    path = folder / fmt.CURRENT
    fd = locked(path)
    try:
        if os.fstat(fd).st_size + len(line) > fmt.MAX_FILE_BYTES:
            os.replace(path, folder / fmt.OLD)  # still under the lock: others re-open the new file
            old, fd = fd, locked(path)
            os.close(old)
        os.write(fd, line)
    finally:
        os.close(fd)
    return path


def locked(path: Path) -> int:
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


def private_file(path: Path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, fmt.FILE_MODE)
    os.fchmod(fd, fmt.FILE_MODE)
    return os.fdopen(fd, "w")
