"""The room's rows as a table for a terminal: learners who are not ready first, then a count."""

from __future__ import annotations

import json
from dataclasses import asdict

from ppkit.room.collect import RoomRow

ORDER = ("unreachable", "not ready", "no server", "warnings", "ready")


def render(rows: list[RoomRow], width: int = 120) -> str:
    rows = sorted(rows, key=lambda r: (ORDER.index(r.state), r.user))
    name_w = max([len("learner"), *(len(r.user) for r in rows)])
    state_w = max(len(s) for s in ORDER)
    why_w = max(20, width - name_w - state_w - 4)
    lines = [f"{'learner':<{name_w}}  {'state':<{state_w}}  why", f"{'-' * name_w}  {'-' * state_w}  {'-' * 3}"]
    for r in rows:
        why = r.why if len(r.why) <= why_w else r.why[: why_w - 3] + "..."
        lines.append(f"{r.user:<{name_w}}  {r.state:<{state_w}}  {why}")
    ready = sum(r.ready for r in rows)
    lines.append(f"{ready}/{len(rows)} ready" + "".join(
        f", {n} {s}" for s in ORDER[:3] if (n := sum(r.state == s for r in rows))))
    return "\n".join(lines)


def as_json(rows: list[RoomRow]) -> str:
    """Every row with the learner's whole preflight report, for a script or a notebook."""
    return json.dumps([{**asdict(r), "ready": r.ready} for r in rows], indent=1)
