"""The record's format, shared by the writer (record.py) and the reader (read.py): where it lies, its
bounds, and how one event becomes one line.

One JSON object per line, UTF-8, at most ``MAX_LINE_BYTES`` bytes with its newline. Every line has
``v`` (``VERSION``), ``t`` (Unix time), ``kind``, ``notebook`` (the kernel's ``JPY_SESSION_NAME``, else
null) and ``pid``; each kind adds the fields ``KINDS`` lists (``seconds`` only for a hung cluster).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

VERSION = 1
DIR_ENV = "PPKIT_RECORD_DIR"  # another folder than ~/ppkit-progress
SWITCH_ENV = "PPKIT_RECORD"  # "off": nothing is written
CURRENT, OLD, OFF = "record.jsonl", "record.old.jsonl", "OFF"
MAX_LINE_BYTES = 2048
MAX_FILE_BYTES = 256 * 1024  # record.jsonl is rotated to record.old.jsonl before it passes this
DIR_MODE, FILE_MODE = 0o700, 0o600
CUT = "..."

KINDS = {
    "check": ("exercise", "status"),  # + "reason" when failed
    "error": ("error", "message"),
    "cluster": ("state", "detail"),  # + "seconds" when hung
    "preflight": ("verdict", "summary"),
}
CHECK_STATUSES = ("passed", "failed", "not written")
CLUSTER_STATES = ("running", "finished", "stopped", "hung", "died")  # stopped: by the learner (Kernel > Interrupt)
VERDICTS = ("ready", "warnings", "not ready")
COMMON = ("v", "t", "kind", "notebook", "pid")


def record_dir() -> Path:
    """The folder of the record, the same for every process of the learner: ``PPKIT_RECORD_DIR`` (absolute, or
    ``~/...``), else ``~/ppkit-progress``. Visible on purpose: the learner can open it. Under a Jupyter server
    rooted inside the home, ``<root>/ppkit-progress`` is made a link to it, where the server's contents API (the
    file browser, the instructor's ``ppkit room``) reaches it (place.py). Raises ConfigError for a relative
    ``PPKIT_RECORD_DIR``."""
    named = os.environ.get(DIR_ENV)
    if not named:
        return Path.home() / "ppkit-progress"
    folder = Path(named).expanduser()
    if not folder.is_absolute():
        from ppkit.errors import ConfigError

        raise ConfigError(f"{DIR_ENV}={named!r} is a relative path, which would name another folder in each "
                          "process's working directory (a kernel's notebook folder, a terminal's current one); "
                          f"give an absolute path or one starting with ~/, e.g. {DIR_ENV}=~/notebooks/ppkit-progress")
    return folder


@functools.cache
def jupyter_root() -> Path | None:
    """The root folder of the Jupyter server this process runs under (a kernel's, or a terminal's in JupyterLab),
    or None: the first of JPY_PARENT_PID (a kernel's server) and this process's ancestors with a
    ``jpserver-<pid>.json`` in Jupyter's runtime folder (jupyter_server writes it with its ``root_dir``) written
    after that process started: a file left by a dead server whose pid is now another process's is not taken
    (jupyter_server's own list_running_servers only asks whether the pid is alive, which a reused pid is)."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime = Path(jupyter_runtime_dir())
    except Exception:  # noqa: BLE001 - no Jupyter here: no server to be under
        return None
    pids = [int(p) for p in [os.environ.get("JPY_PARENT_PID", "")] if p.isdigit()] + _ancestors()
    for pid in pids:
        info_file = runtime / f"jpserver-{pid}.json"
        try:
            info = json.loads(info_file.read_text())
            if int(info["pid"]) != pid or info_file.stat().st_mtime < _started(pid) - 1.0:
                continue
            return Path(info["root_dir"]).expanduser().resolve()
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _started(pid: int) -> float:
    """When process ``pid`` started (Unix time, from /proc; 0.0 where that cannot be read: no check)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def _ancestors(depth: int = 16) -> list[int]:
    """This process's parent, its parent, ... (from /proc on Linux; elsewhere the parent only)."""
    found, pid = [], os.getppid()
    while pid > 1 and len(found) < depth:
        found.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # the fields after the command's name: state, ppid
        except (OSError, ValueError, IndexError):
            break
    return found


def switched_off_by_env() -> bool:
    return os.environ.get(SWITCH_ENV, "").strip().lower() in ("off", "0", "no", "false")


def first_line(text: object) -> str:
    """The first non-empty line of ``text`` (an error's message), stripped; when it only announces what follows
    (it ends with ":", as "ring_shift: 2 problem(s) in 3 cases:" does), the next line is joined to it, so that the
    one line still says what went wrong."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def encode(event: dict) -> bytes:
    """``event`` as one line of at most ``MAX_LINE_BYTES`` bytes: the longest texts are cut, ending in "..."."""
    event = dict(event)
    line = _dumps(event)
    while len(line) > MAX_LINE_BYTES:
        texts = [k for k, v in event.items() if isinstance(v, str) and len(v) > len(CUT)]
        if not texts:
            raise ValueError(f"a progress event cannot be cut to {MAX_LINE_BYTES} bytes: {line[:200]!r}")
        longest = max(texts, key=lambda k: len(event[k]))
        text = event[longest]
        size = len(_dumps(text)) - 1  # its bytes in the line, quotes and escapes included
        wanted = size - (len(line) - MAX_LINE_BYTES) - len(CUT) - 2
        # as many characters as fit at this text's bytes per character; always fewer than before
        keep = max(0, min(len(text) - len(CUT) - 1, len(text) * wanted // size))
        event[longest] = text[:keep] + CUT
        line = _dumps(event)
    return line


def _dumps(event) -> bytes:
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "replace")
