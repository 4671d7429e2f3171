"""Where the record lies, the same folder for every process of one learner, and what moves into it once.

    ~/ppkit-progress/                 the record (PPKIT_RECORD_DIR: another absolute folder), whatever the process:
                                      a kernel, a JupyterLab terminal, ssh, VS Code, ``ppkit progress --off``
    <root>/ppkit-progress -> ~/ppkit-progress
                                      a link, made by a process under a Jupyter server rooted inside the home
                                      (``c.Spawner.notebook_dir = "~/notebooks"``), so that the server's contents
                                      API (the learner's file browser, the instructor's ``ppkit room``) reaches the
                                      record: jupyter_server refuses a path outside its root by the path's
                                      ``abspath``, which a link inside the root passes (it does not resolve links)

Once per process (``settle``, called by the writer and the reader), under a lock on the record's folder:
- a real folder ``<root>/ppkit-progress`` (what ppkit wrote there before this layout) is merged into the record
  (its lines kept, newest last, within the writer's bounds), its ``OFF`` kept (an opt-out anywhere is an opt-out),
  and replaced by the link;
- the exercise record of older ppkit, ``~/.ppkit/progress.json`` (or ``$PPKIT_PROGRESS``), becomes check lines of
  the record, and is renamed ``progress.json.migrated`` (not while recording is off: it moves once it is on).
"""

from __future__ import annotations

import calendar
import fcntl
import json
import os
import shutil
import time
from pathlib import Path

from ppkit.progress import format as fmt
from ppkit.progress.files import append_lines, locked, make_folder

LINK_NAME = "ppkit-progress"
OLD_STORE_ENV = "PPKIT_PROGRESS"  # older ppkit's exercise record (one JSON object), named here to migrate it
MIGRATED = ".migrated"
_OLD_STATUS = {"passed": "passed", "failed": "failed", "not written yet": "not written"}
_settled: set[Path] = set()


def settle(folder: Path) -> Path:
    """``folder``, settled once per process when it is the default ``~/ppkit-progress``: under a Jupyter server
    rooted inside the home, ``<root>/ppkit-progress`` merged into it and made a link to it; older ppkit's
    progress.json migrated. Never raises: a failure leaves things as they were (the record works; only the room
    may not see it)."""
    if folder in _settled or os.environ.get(fmt.DIR_ENV) or folder != Path.home() / LINK_NAME:
        return folder
    _settled.add(folder)
    home = Path.home().resolve()
    root = fmt.jupyter_root()
    link = root / LINK_NAME if root is not None and root != home and root.is_relative_to(home) else None
    if (link is None or link.is_symlink()) and not old_store().is_file():
        return folder  # nothing to do: no lock taken, no folder made
    try:
        with _locked_folder(folder):
            if link is not None:
                _link_root(folder, link)
            _migrate_progress_json(folder)
    except OSError:
        pass
    return folder


class _locked_folder:
    """The record folder (made if missing), flock'ed: two kernels starting at once settle one after the other."""

    def __init__(self, folder: Path):
        make_folder(folder)
        self.fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock


def _link_root(folder: Path, link: Path) -> None:
    if link.is_symlink():
        return  # made already (by us, or by the learner: hers to keep)
    if link.is_dir():
        _merge_into(folder, link)
    elif link.exists():
        return  # a file of that name: not ours
    try:
        os.symlink(folder, link, target_is_directory=True)
    except FileExistsError:
        pass


def _merge_into(folder: Path, old: Path) -> None:
    """``old``'s record lines into ``folder``'s (sorted by time; the newest kept within the writer's two files),
    its OFF kept; ``old`` removed, or renamed ``ppkit-progress.merged`` when it holds other files."""
    if (old / fmt.OFF).exists():
        (folder / fmt.OFF).touch(mode=fmt.FILE_MODE)
    held = locked(folder / fmt.CURRENT)  # a writer appending meanwhile waits, then re-opens the new file
    try:
        lines = []
        for place in (folder, old):
            for name in (fmt.OLD, fmt.CURRENT):
                try:
                    lines += (place / name).read_bytes().splitlines(keepends=True)
                except FileNotFoundError:
                    continue
        whole = (line if line.endswith(b"\n") else line + b"\n" for line in lines)
        _write_bounded(folder, sorted(whole, key=_time_of))
    finally:
        os.close(held)
    for name in (fmt.OLD, fmt.CURRENT, fmt.OFF):
        (old / name).unlink(missing_ok=True)
    try:
        old.rmdir()
    except OSError:
        shutil.move(old, old.with_name(LINK_NAME + ".merged"))


def _time_of(line: bytes) -> float:
    try:
        t = json.loads(line).get("t")
        return float(t) if isinstance(t, (int, float)) else 0.0
    except (ValueError, AttributeError):
        return 0.0  # a bad line: kept, oldest, for the reader to count


def _write_bounded(folder: Path, lines: list[bytes]) -> None:
    """``lines`` as record.old.jsonl + record.jsonl, each under MAX_FILE_BYTES: the newest lines win."""
    files: list[list[bytes]] = [[], []]  # newest first: current, old
    sizes = [0, 0]
    which = 0
    for line in reversed(lines):
        if sizes[which] + len(line) > fmt.MAX_FILE_BYTES:
            which += 1
            if which == 2:
                break
        files[which].append(line)
        sizes[which] += len(line)
    for name, kept in ((fmt.CURRENT, files[0]), (fmt.OLD, files[1])):
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, fmt.FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(reversed(kept)))
        os.replace(tmp, folder / name)


def old_store() -> Path:
    return Path(os.environ.get(OLD_STORE_ENV) or Path.home() / ".ppkit" / "progress.json")


def _migrate_progress_json(folder: Path) -> None:
    path = old_store()
    if not path.is_file() or (folder / fmt.OFF).exists() or fmt.switched_off_by_env():
        return
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # not readable: left where it is
    lines = []
    for exercise, entry in (entries.items() if isinstance(entries, dict) else ()):
        status = _OLD_STATUS.get((entry or {}).get("status")) if isinstance(entry, dict) else None
        if status is None:
            continue
        event = {"v": fmt.VERSION, "t": _old_time(entry.get("when")), "kind": "check", "notebook": None,
                 "pid": None, "exercise": str(exercise), "status": status}
        if status == "failed":
            event["reason"] = f"(recorded by an older ppkit in {path})"
        lines.append(fmt.encode(event))
    if lines:
        append_lines(folder, b"".join(sorted(lines, key=_time_of)))
    path.rename(path.with_name(path.name + MIGRATED))


def _old_time(when) -> float:
    """Older ppkit's "%Y-%m-%d %H:%M UTC" as Unix time (now when unreadable)."""
    try:
        return float(calendar.timegm(time.strptime(str(when), "%Y-%m-%d %H:%M UTC")))
    except ValueError:
        return round(time.time(), 3)
