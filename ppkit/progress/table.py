"""The learner's own view of their record (``ppkit progress``): per notebook, the exercises passed (and, among
them, those failed since, with the reason), failed (with the last reason), not written and not tried; the last
error and the last cluster state, each with how long ago; the last preflight verdict; and what was wrong with the
files, if anything."""

from __future__ import annotations

import time
from pathlib import Path

from ppkit.progress import format as fmt
from ppkit.progress.read import Record
from ppkit.progress.summary import NotebookSummary

ABOUT = ("It stays on this machine: ppkit sends nothing anywhere. In a workshop on JupyterHub, the instructor's\n"
         "`ppkit room --progress` can read it through your own Jupyter server. `ppkit progress --off` stops\n"
         "recording (or PPKIT_RECORD=off in the environment).")


def exercises_by_notebook() -> dict[str, list[str]]:
    """The course's exercises by notebook file name (without .ipynb), from its plain data (exercises/course.py)."""
    from ppkit.exercises.course import EXERCISES

    found: dict[str, list[str]] = {}
    for exercise in EXERCISES:
        found.setdefault(exercise["notebook"], []).append(exercise["name"])
    return found


def not_tried(book: NotebookSummary, course: dict[str, list[str]]) -> list[str]:
    """The notebook's exercises (by its file name) that no check in the record mentions."""
    if book.notebook is None:
        return []
    tried = {e.exercise for e in book.exercises}
    return [name for name in course.get(Path(book.notebook).stem, []) if name not in tried]


def off_because(folder: Path) -> str | None:
    """Why nothing is recorded now, or None when recording is on."""
    if fmt.switched_off_by_env():
        return f"{fmt.SWITCH_ENV}=off is set in the environment"
    if (folder / fmt.OFF).exists():
        return f"the file {folder / fmt.OFF} exists (`ppkit progress --on` removes it)"
    return None


def as_dict(record: Record, folder: Path, course: dict[str, list[str]]) -> dict:
    """``ppkit progress --json``: the summary (without the events), the folder and whether it records."""
    body = record.to_dict(events=False)
    for book, shown in zip(record.notebooks, body["notebooks"]):
        shown["not_tried"] = not_tried(book, course)
    return {"folder": str(folder), "recording": off_because(folder) is None, "off_because": off_because(folder),
            "sent_anywhere": False, **body}


def ago(t: float, now: float | None = None) -> str:
    seconds = max(0.0, (time.time() if now is None else now) - t)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def format_table(record: Record, folder: Path, course: dict[str, list[str]], now: float | None = None) -> str:
    why_off = off_because(folder)
    lines = [f"Your progress record: {folder} ({fmt.CURRENT}, {fmt.OLD}; {record.lines} line(s) read).", ABOUT]
    if why_off:
        lines.append(f"Recording is OFF: {why_off}.")
    if not record.notebooks and record.preflight is None:
        lines.append("Nothing recorded yet: an exercise check, a ppkit error, a ppkit.spawn or %%torchrun run, "
                     "or `ppkit preflight` adds a line.")
    for book in record.notebooks:
        lines += ["", f"{book.notebook or '(outside a notebook)'}  (last: {ago(book.last_t, now)})"]
        failed = [e for e in book.exercises if e.status == "failed"]
        since = [e for e in book.exercises if e.failed_since_pass]
        rows = [("passed", ", ".join(book.with_status("passed"))),
                ("failed since passed", "; ".join(f"{e.exercise} ({ago(e.failed_t, now)}): {e.reason}" for e in since)),
                ("failed", "; ".join(f"{e.exercise} ({ago(e.t, now)}): {e.reason}" for e in failed)),
                ("not written", ", ".join(book.with_status("not written"))),
                ("not tried", ", ".join(not_tried(book, course)))]
        if book.last_error:
            err = book.last_error
            rows.append(("last error", f"{err.error} ({ago(err.t, now)}): {err.message}"))
        if book.last_cluster:
            run = book.last_cluster
            hung = f" for {run.seconds:g} s" if run.seconds is not None else ""
            rows.append(("cluster", f"{run.state}{hung} ({ago(run.t, now)}): {run.detail}"))
        lines += [f"  {name:<12}{text}" if len(name) < 12 else f"  {name}  {text}" for name, text in rows if text]
    if record.preflight:
        pre = record.preflight
        lines += ["", f"preflight     {pre.verdict} ({ago(pre.t, now)}): {pre.summary}"]
    if record.problems:
        lines += ["", "Not read: " + "; ".join(record.problems) + "."]
    return "\n".join(lines)
