"""The record's format, shared by the writer (record.py) and the reader (read.py): where it lies, its
bounds, and how one event becomes one line.

One JSON object per line, UTF-8, at most ``MAX_LINE_BYTES`` bytes with its newline. Every line has
``v`` (``VERSION``), ``t`` (Unix time), ``kind``, ``notebook`` (the kernel's ``JPY_SESSION_NAME``, else
null) and ``pid``; each kind adds the fields ``KINDS`` lists (``seconds`` only for a hung cluster).
"""

from __future__ import annotations

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
    """The folder of the record: ``PPKIT_RECORD_DIR``, else ``~/ppkit-progress`` (visible on purpose:
    the learner can open it, and the Jupyter contents API serves no hidden path)."""
    named = os.environ.get(DIR_ENV)
    return Path(named).expanduser() if named else Path.home() / "ppkit-progress"


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
