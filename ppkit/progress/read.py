"""The reader of a progress record: the text of ``record.old.jsonl`` and ``record.jsonl`` in, plain data out.

    from ppkit.progress.read import parse
    record = parse(old_text, current_text)   # str, bytes or None (no such file); never raises
    record.notebooks[0].with_status("failed"), record.bad_lines, record.to_json()

Whatever the files hold, a reader survives it: a line that is not JSON, not an object, of an unknown
kind or version, missing a field, longer than a writer writes, or cut short at the end is counted in
``bad_lines`` (by why) and left out; of a file far larger than the bound only its end is read, and it
is named in ``oversized``. ``ppkit room --progress`` parses what it fetched through a learner's Jupyter
server with this; ``ppkit progress`` reads the learner's own folder with ``read_folder``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ppkit.progress import format as fmt
from ppkit.progress import place
from ppkit.progress.summary import Event, NotebookSummary, PreflightSeen, summarise

FAR_LARGER = 2 * fmt.MAX_FILE_BYTES  # a file past this was not written by ppkit alone: only its end is read
_VALUES = {("check", "status"): fmt.CHECK_STATUSES, ("cluster", "state"): fmt.CLUSTER_STATES,
           ("preflight", "verdict"): fmt.VERDICTS}


@dataclass
class Record:
    """A parsed record: its good ``events`` (in time order), their per-notebook summary, the last
    preflight verdict, how many lines were read, the ``bad_lines`` by why, the ``oversized`` files."""

    events: list[Event] = field(default_factory=list)
    notebooks: list[NotebookSummary] = field(default_factory=list)
    preflight: PreflightSeen | None = None
    lines: int = 0
    bad_lines: dict[str, int] = field(default_factory=dict)
    oversized: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """What was wrong with the files, in words (empty when nothing was)."""
        said = [f"{count} line(s) {why}" for why, count in self.bad_lines.items()]
        said += [f"{name} is far larger than ppkit writes ({FAR_LARGER // 1024} KiB): only its end was read"
                 for name in self.oversized]
        return said

    def to_dict(self, events: bool = True) -> dict:
        body = dataclasses.asdict(self)
        if not events:
            del body["events"]
        body["problems"] = self.problems
        return body

    def to_json(self, events: bool = True) -> str:
        """One JSON object: the fields above (``events=False``: without the events) and ``problems``."""
        return json.dumps(self.to_dict(events), ensure_ascii=False)


def parse(old_text: str | bytes | None, current_text: str | bytes | None) -> Record:
    """The record held by the two files' texts (None: that file does not exist)."""
    record = Record()
    events: list[Event] = []
    for name, text in ((fmt.OLD, old_text), (fmt.CURRENT, current_text)):
        events += _parse_file(name, text, record)
    record.events = sorted(events, key=lambda e: e.t)
    record.notebooks, record.preflight = summarise(record.events)
    return record


def read_folder(folder: Path | None = None) -> Record:
    """``parse`` of the two files in ``folder`` (default: the learner's record folder)."""
    folder = place.settle(folder or fmt.record_dir())
    return parse(*(_tail(folder / name) for name in (fmt.OLD, fmt.CURRENT)))


def _tail(path: Path) -> bytes | None:
    """The file, or its last FAR_LARGER bytes plus one when larger (enough for ``parse`` to say so)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - FAR_LARGER - 1))
            return f.read()
    except FileNotFoundError:
        return None


def _parse_file(name: str, text: str | bytes | None, record: Record) -> list[Event]:
    if text is None:
        return []
    if not isinstance(text, (str, bytes, bytearray)):
        _bad(record, f"of {name}, which is not text ({type(text).__name__})")
        return []
    if len(text) > FAR_LARGER:  # in bytes or characters: a character is at least one byte
        record.oversized.append(name)
        text = text[-fmt.MAX_FILE_BYTES:]
        newline = "\n" if isinstance(text, str) else b"\n"
        text = text[text.find(newline) + 1:] if newline in text else text  # from the first whole line
    if not isinstance(text, str):
        text = bytes(text).decode("utf-8", "replace")
    pieces = text.split("\n")  # not splitlines(): U+2028 may stand inside a JSON string
    last = pieces.pop()  # "" when the text ends with a newline, as the writer leaves it
    if last:
        _bad(record, "cut short at the end of a file")
    events = []
    for line in pieces:
        if not line.strip():
            continue
        record.lines += 1
        event, why = _event(line)
        if event is None:
            _bad(record, why)
        else:
            events.append(event)
    return events


def _bad(record: Record, why: str) -> None:
    record.bad_lines[why] = record.bad_lines.get(why, 0) + 1


def _event(line: str) -> tuple[Event | None, str]:
    """The line's event, or None and why it is not one."""
    if len(line) >= fmt.MAX_LINE_BYTES or len(line.encode("utf-8", "replace")) >= fmt.MAX_LINE_BYTES:
        return None, f"longer than {fmt.MAX_LINE_BYTES} bytes"
    try:
        body = json.loads(line)
    except (ValueError, RecursionError):
        return None, "not JSON"
    if not isinstance(body, dict):
        return None, "not a JSON object"
    if body.get("v") != fmt.VERSION or isinstance(body.get("v"), bool):
        return None, f"of an unknown version (not v {fmt.VERSION})"
    kind = body.get("kind")
    if kind not in fmt.KINDS:
        return None, "of an unknown kind"
    t, pid, notebook = body.get("t"), body.get("pid"), body.get("notebook")
    if not _number(t) or not (pid is None or (_number(pid) and float(pid).is_integer())) \
            or not (notebook is None or isinstance(notebook, str)):
        return None, "with a bad t, pid or notebook"
    fields = {k: v for k, v in body.items() if k not in fmt.COMMON}
    needed = (*fmt.KINDS[kind], *(("reason",) if fields.get("status") == "failed" else ()))
    if not all(isinstance(fields.get(name, "" if name == "reason" else None), str) for name in needed):
        return None, f"without the fields of a {kind!r} line"
    for (of_kind, name), allowed in _VALUES.items():
        if kind == of_kind and fields[name] not in allowed:
            return None, f"with an unknown {name}"
    if "seconds" in fields and not _number(fields["seconds"]):
        return None, "with a bad seconds"
    return Event(kind, float(t), notebook, None if pid is None else int(pid), fields), ""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
