"""The room's progress rows for people and scripts: a terminal table, JSON, and a CSV for after the workshop.

    print(render(rows))          # stuck learners first, one line each, then a count
    print(as_json(rows))         # {"learners": [{"user": ..., "state": ..., ...}]}
    print(as_csv(rows))          # one line per learner x exercise: attempts, first try, minutes to pass, ...
    print(exercise_summary(rows))  # per exercise: who tried, passed, median minutes to pass, commonest failure
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import PurePosixPath

from ppkit.room.progress_rows import ORDER, ProgressRow, sort_rows

CSV_COLUMNS = ("user", "notebook", "exercise", "status", "attempts", "failures", "first_try", "first_pass",
               "minutes_to_pass", "last_failure_reason")


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def _ago(seconds: float) -> str:
    return f"{seconds / 60:.0f} min ago" if seconds >= 90 else f"{seconds:.0f} s ago"


def _open(row: ProgressRow) -> str:
    parts = []
    for n in row.notebooks:
        state = f"busy {n['busy_s']:.0f} s" if n["busy_s"] is not None else n["kernel"]
        parts.append(f"{PurePosixPath(n['path']).stem} ({state})")
    return ", ".join(parts) or "-"


def _counts(row: ProgressRow) -> tuple[int, int, int]:
    got = [sum(len(e[k]) for e in row.exercises.values()) for k in ("passed", "failed", "not_tried")]
    return got[0], got[1], got[2]


def _last_error(row: ProgressRow) -> str:
    e = row.last_error
    return f"{e['error']} {_ago(e['ago_s'])}" if e else "-"


def render(rows: list[ProgressRow], width: int = 160) -> str:
    """One line per learner (stuck first): state, exercises passed/failing/not tried, why, open notebooks (kernel
    state, busy seconds), the last error, the last cluster state and preflight verdict, cut to `width`; then a
    count per state."""
    rows = sort_rows(rows)
    table = [("learner", "state", "pass/fail/todo", "why", "open notebooks (kernel)", "last error", "cluster",
              "preflight")]
    for r in rows:
        table.append((r.user, r.state, "/".join(map(str, _counts(r))), _short(r.why, 52), _open(r), _last_error(r),
                      r.cluster["state"] if r.cluster else "-", r.preflight["verdict"] if r.preflight else "-"))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines = [_short(line, width) for line in lines]
    states = Counter(r.state for r in rows)
    lines.append(f"{len(rows)} learner(s): " + ", ".join(f"{states[s]} {s}" for s in ORDER if states[s]))
    return "\n".join(lines)


def as_dict(row: ProgressRow) -> dict:
    return asdict(row)


def as_json(rows: list[ProgressRow]) -> str:
    """``{"learners": [...]}``, stuck first; every field of ProgressRow (times as Unix seconds, ages in s)."""
    return json.dumps({"learners": [as_dict(r) for r in sort_rows(rows)]}, indent=1)


def _iso(t: float | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds") if t is not None else ""


def csv_lines(rows: list[ProgressRow]) -> list[dict]:
    """One dict per learner x exercise (checked, or not tried in a notebook they had open or recorded); a
    learner with none gets one line whose status is the row's state, so every learner appears."""
    lines = []
    for r in sorted(rows, key=lambda r: r.user):
        mine = []
        for a in r.attempts:
            to_pass = (a.first_pass - a.first_try) / 60 if a.first_pass is not None and a.first_try else None
            mine.append({"user": r.user, "notebook": a.notebook or "", "exercise": a.exercise, "status": a.status,
                         "attempts": a.attempts, "failures": a.failures, "first_try": _iso(a.first_try),
                         "first_pass": _iso(a.first_pass),
                         "minutes_to_pass": "" if to_pass is None else f"{to_pass:.1f}",
                         "last_failure_reason": a.last_failure or ""})
        for notebook, entry in r.exercises.items():
            mine += [{**dict.fromkeys(CSV_COLUMNS, ""), "user": r.user, "notebook": notebook, "exercise": name,
                      "status": "not tried", "attempts": 0, "failures": 0} for name in entry["not_tried"]
                     if not any(m["exercise"] == name for m in mine)]
        lines += mine or [{**dict.fromkeys(CSV_COLUMNS, ""), "user": r.user, "status": r.state}]
    return lines


def as_csv(rows: list[ProgressRow]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_lines(rows))
    return out.getvalue()


def exercise_summary(rows: list[ProgressRow]) -> str:
    """Per exercise, most failures first (then fewest passes): learners who tried, passed, median minutes to
    pass, failures, and the commonest failure reason (over each learner's last one)."""
    by_exercise: dict[str, list[dict]] = {}
    for line in csv_lines(rows):
        if line["exercise"] and line["status"] != "not tried":
            by_exercise.setdefault(line["exercise"], []).append(line)
    if not by_exercise:
        return "no exercise was checked yet"
    out = ["exercise                  tried  passed  median min to pass  failures  commonest last failure"]
    ordered = sorted(by_exercise.items(), key=lambda kv: (-sum(int(line["failures"]) for line in kv[1]),
                                                         sum(line["status"] == "passed" for line in kv[1]), kv[0]))
    for name, lines in ordered:
        minutes = [float(line["minutes_to_pass"]) for line in lines if line["minutes_to_pass"] != ""]
        median = f"{statistics.median(minutes):.1f}" if minutes else "-"
        reasons = Counter(line["last_failure_reason"] for line in lines if line["last_failure_reason"])
        reason = f"{reasons.most_common(1)[0][1]}x {reasons.most_common(1)[0][0]}" if reasons else "-"
        passed = sum(line["status"] == "passed" for line in lines)
        failures = sum(int(line["failures"]) for line in lines)
        out.append(f"{name:<25} {len(lines):>5}  {passed:>6}  {median:>18}  {failures:>8}  {_short(reason, 70)}")
    return "\n".join(out)
