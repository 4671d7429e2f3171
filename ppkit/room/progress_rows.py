"""One row per learner from what progress_fetch got: where they are, what passed, who is stuck and why.

    row = learner_row(fetched, events, record_problems, stuck_after=5)
    row.state   # "stuck", "unreachable", "bad record", "no server", "no record" or "ok"
    row.stuck   # ["failed best_num_microbatches 7 min ago, no pass since", "kernel of 06_pipeline.ipynb busy 312 s"]

Ages are measured on the learner's server's clock (``Fetched.now``, its Date header), so an instructor's laptop
with a wrong clock still sees "busy 312 s". ``events`` are the record's valid lines (ppkit.progress.read).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import PurePosixPath

from ppkit.progress.read import parse
from ppkit.progress.summary import Event, summarise
from ppkit.room.hub_api import timestamp
from ppkit.room.progress_fetch import Fetched


@cache
def course_exercises() -> dict[str, tuple[str, ...]]:
    """notebook (file name without .ipynb) -> its exercises, from the course's plain data (ppkit/exercises/course.py,
    which the catalog reads too; importing it imports no checker and no torch)."""
    from ppkit.exercises.course import EXERCISES

    found: dict[str, tuple[str, ...]] = {}
    for exercise in EXERCISES:
        found[exercise["notebook"]] = (*found.get(exercise["notebook"], ()), exercise["name"])
    return found


ORDER = ("stuck", "unreachable", "bad record", "no server", "no record", "ok")
TROUBLE = ("hung", "died")  # a run the learner stopped herself ("stopped": Kernel > Interrupt) is not trouble
# What an empty or missing record folder means, and what to set when it is not the learner's doing
NO_RECORD = ("nothing recorded yet under her server's root: no check or ppkit run yet, or recording is off; if "
             "she has run checks, her record (~/ppkit-progress, linked under her server's root when that root is "
             "inside her home) is out of its reach: her root is outside her home, or shared. Set PPKIT_RECORD_DIR "
             "to an absolute folder under the root in c.Spawner.environment (a callable, to name each learner: "
             "environment values do not expand {username}; docs/workshop.md) and pass the same folder, relative to "
             "the root, as --record-path (with {username})")
SAME_CELL_S = 10.0  # a died run's own error (ppkit records it as the cell ends) follows it within this


@dataclass
class Attempts:
    """How one learner's checks of one exercise went (a line of ``ppkit room --progress --csv``)."""

    notebook: str | None
    exercise: str
    status: str = "not tried"  # ppkit.progress.summary's: "passed" once passed, else the last check's
    attempts: int = 0  # checks that ran the learner's code: passed + failed
    failures: int = 0
    first_try: float | None = None
    first_pass: float | None = None
    last_failure: str | None = None  # the checker's first line
    stuck_since: float | None = None  # the first failure not followed by a pass


@dataclass
class ProgressRow:
    user: str
    state: str
    why: str  # one line
    stuck: list[str] = field(default_factory=list)
    notebooks: list[dict] = field(default_factory=list)  # {"path", "kernel", "busy_s"}: the open sessions
    exercises: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # notebook -> passed/failed/not_tried
    attempts: list[Attempts] = field(default_factory=list)
    last_error: dict | None = None  # {"error", "message", "notebook", "ago_s"}
    cluster: dict | None = None  # the latest cluster event of a kernel whose cluster hung or died, else the latest
    preflight: dict | None = None  # {"verdict", "summary", "ago_s"}
    problems: list[str] = field(default_factory=list)


def _ago(now: float, t: float) -> float:
    return round(max(0.0, now - t), 1)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _stem(notebook: str | None) -> str | None:
    return PurePosixPath(notebook).stem if notebook else None


def open_notebooks(sessions: list[dict], now: float) -> list[dict]:
    """The sessions' notebooks with their kernel's state; busy_s: seconds since the busy kernel's last message."""
    found = []
    for session in sessions:
        kernel = session.get("kernel") or {}
        state = kernel.get("execution_state") or "unknown"
        since = timestamp(kernel.get("last_activity"))
        busy = _ago(now, since) if state == "busy" and since is not None else None
        found.append({"path": session.get("path") or session.get("name") or "?", "kernel": state, "busy_s": busy})
    return sorted(found, key=lambda n: (n["busy_s"] is None, n["path"]))  # busy kernels first


def as_server_paths(events: list[dict], paths: list[str]) -> list[dict]:
    """Events whose notebook is an open session's, named by that session's path.

    A kernel records JPY_SESSION_NAME, which jupyter_server sets to the notebook's path on disk when JupyterLab
    opens it (/home/ana/notebooks/06_pipeline.ipynb); /api/sessions names it relative to the server's root
    (notebooks/06_pipeline.ipynb). ppkit records it relative to the root when it knows the root (taken as it is);
    an absolute path (an older record, or a kernel that found no root) that ends with a session's path is that
    notebook, the longest such path winning.
    """
    def named(path):
        if not path or path in paths or not path.startswith("/"):
            return path
        ends = [p for p in paths if path.endswith("/" + p.lstrip("/"))]
        return max(ends, key=len) if ends else path

    return [{**e, "notebook": named(e.get("notebook"))} for e in events]


def exercise_attempts(events: list[dict]) -> list[Attempts]:
    """Every exercise the learner checked, in the order first checked; events in time order. Its status is
    ppkit.progress.summary's (the one meaning ``ppkit progress`` and ``ppkit exercises`` show); the room adds only
    its counts: checks that ran her code, the first try, and since when a failure stands with no pass or "not
    written" after it."""
    checks = [e for e in events if e.get("kind") == "check"]
    books, _ = summarise([Event("check", e["t"], e.get("notebook"), e.get("pid"), e) for e in checks])
    found = []
    for book in books:
        for state in book.exercises:
            mine = [e for e in checks if (e.get("notebook"), e.get("exercise")) == (book.notebook, state.exercise)]
            ran = [e for e in mine if e.get("status") in ("passed", "failed")]
            a = Attempts(book.notebook, state.exercise, state.status, len(ran), state.failures,
                         ran[0]["t"] if ran else None, state.passed_t, state.reason or None)
            if state.status == "failed":
                since = [e for e in mine if e.get("status") != "failed"]
                a.stuck_since = next(e["t"] for e in mine if e["t"] > (since[-1]["t"] if since else -1.0))
            found.append(a)
    return sorted(found, key=lambda a: min(e["t"] for e in checks
                                           if (e.get("notebook"), e.get("exercise")) == (a.notebook, a.exercise)))


def per_notebook(attempts: list[Attempts], notebooks: list[str | None]) -> dict[str, dict[str, list[str]]]:
    """notebook -> {"passed": [...], "failed": [...], "not_tried": [...]} for every notebook seen."""
    table: dict[str, dict[str, list[str]]] = {}
    for path in [*notebooks, *(a.notebook for a in attempts)]:
        key = path or "(no notebook)"
        if key not in table:
            table[key] = {"passed": [], "failed": [], "not_tried": list(course_exercises().get(_stem(path), ()))}
    for a in attempts:
        entry = table[a.notebook or "(no notebook)"]
        if a.status in ("passed", "failed"):
            entry[a.status].append(a.exercise)
            if a.exercise in entry["not_tried"]:
                entry["not_tried"].remove(a.exercise)
    return table


def _last(events: list[dict], kind: str) -> dict | None:
    return next((e for e in reversed(events) if e.get("kind") == kind), None)


def still_current(run: dict, events: list[dict], kernels: dict[str, tuple] | None, now: float, limit: float
                  ) -> bool:
    """Whether a hung or died run is still where the learner is, rather than history. Not when she did something in
    that kernel since (a check, another run, a ppkit error of a later cell), nor when its kernel is gone (the
    notebook's later events come from another kernel: restarted; or no open session holds it: closed). A hang is
    current only while its notebook's kernel is busy (an interrupt or a restart left it idle); a died run only until
    that kernel's last activity passes the run's cell (SAME_CELL_S): cells that record nothing move it too. A run
    with no notebook (a script) is history after `limit` seconds. ``kernels``: open notebook -> (execution_state,
    last_activity), None when the sessions could not be read (then a notebook's run stays current)."""
    for e in events:
        if e["t"] <= run["t"]:
            continue
        if e.get("pid") == run.get("pid") and not (e.get("kind") == "error" and e["t"] - run["t"] < SAME_CELL_S):
            return False  # her next activity in that kernel (the run's own error, recorded as its cell ends, is not)
        if run.get("notebook") and e.get("notebook") == run.get("notebook") and e.get("pid") != run.get("pid"):
            return False  # the notebook has another kernel now
    notebook = run.get("notebook")
    if not notebook:
        return now - run["t"] < limit
    if kernels is None:
        return True
    if notebook not in kernels:
        return False
    state, active = kernels[notebook]
    if run.get("state") == "hung":
        return state == "busy"
    return active is None or active <= run["t"] + SAME_CELL_S


def _cluster(events: list[dict], kernels: dict[str, tuple] | None, now: float, limit: float) -> dict | None:
    """The cluster to show: the latest current trouble (a kernel whose latest run hung or died, and is
    still_current), else the latest run's state; ``current``: whether a hang or death is still current."""
    latest: dict = {}
    for e in events:
        if e.get("kind") == "cluster":
            latest[e.get("pid")] = e  # one kernel's clusters: its latest state counts
    if not latest:
        return None
    troubled = [e for e in latest.values()
                if e.get("state") in TROUBLE and still_current(e, events, kernels, now, limit)]
    e = max(troubled or latest.values(), key=lambda e: e["t"])
    return {"state": e.get("state"), "detail": e.get("detail"), "seconds": e.get("seconds"),
            "notebook": e.get("notebook"), "ago_s": _ago(now, e["t"]), "current": bool(troubled)}


def _kernels(sessions: list[dict] | None) -> dict[str, tuple] | None:
    """open notebook path -> (its kernel's execution_state, last_activity as Unix time or None)."""
    if sessions is None:
        return None
    return {(s.get("path") or s.get("name") or "?"): ((s.get("kernel") or {}).get("execution_state"),
                                                     timestamp((s.get("kernel") or {}).get("last_activity")))
            for s in sessions}


def learner_row(fetched: Fetched, events: list[dict], record_problems: list[str], stuck_after: float = 5.0
                ) -> ProgressRow:
    """The row for one learner; `stuck_after` in minutes."""
    now, limit = fetched.now, stuck_after * 60
    problems = [*fetched.problems, *record_problems]
    if fetched.server != "running":
        return ProgressRow(fetched.user, fetched.server, "; ".join(problems) or fetched.server, problems=problems)
    notebooks = open_notebooks(fetched.sessions or [], now)
    events = as_server_paths(events, [n["path"] for n in notebooks])
    attempts = exercise_attempts(events)
    row = ProgressRow(fetched.user, "ok", "", notebooks=notebooks, attempts=attempts, problems=problems,
                      exercises=per_notebook(attempts, [n["path"] for n in notebooks]))
    for a in attempts:
        if a.stuck_since is not None and now - a.stuck_since >= limit:
            row.stuck.append(f"failed {a.exercise} {_minutes(now - a.stuck_since)} ago, no pass since"
                             + (f" ({a.last_failure})" if a.last_failure else ""))
    for n in notebooks:
        if n["busy_s"] is not None and n["busy_s"] >= limit:
            row.stuck.append(f"kernel of {PurePosixPath(n['path']).name} busy {n['busy_s']:.0f} s")
    row.cluster = _cluster(events, _kernels(fetched.sessions), now, limit)
    if row.cluster and row.cluster["current"]:
        row.stuck.append(f"cluster {row.cluster['state']} {_minutes(row.cluster['ago_s'])} ago: "
                         f"{row.cluster['detail']}")
    if (error := _last(events, "error")) is not None:
        row.last_error = {"error": error.get("error"), "message": error.get("message"),
                          "notebook": error.get("notebook"), "ago_s": _ago(now, error["t"])}
    if (pre := _last(events, "preflight")) is not None:
        row.preflight = {"verdict": pre.get("verdict"), "summary": pre.get("summary"), "ago_s": _ago(now, pre["t"])}
    passed = sum(a.status == "passed" for a in attempts)
    failed = sum(a.status == "failed" for a in attempts)
    if row.stuck:
        row.state, row.why = "stuck", "; ".join(row.stuck)
    elif problems and not events:
        row.state, row.why = "bad record", "; ".join(problems)
    elif not events:
        row.state, row.why = "no record", NO_RECORD
    else:
        row.why = f"{passed} passed, {failed} failing" + (f"; {problems[0]}" if problems else "")
    if fetched.idle_s is not None:
        row.why += (f" (idle {_minutes(fetched.idle_s)}: not polled until the hub sees her active again, so that "
                    "the idle culler may stop her server)")
    return row


def row_of(fetched: Fetched, stuck_after: float = 5.0) -> ProgressRow:
    """learner_row of what was fetched, the record parsed by ppkit.progress.read (which never raises)."""
    record = parse(fetched.texts.get("record.old.jsonl"), fetched.texts.get("record.jsonl"))
    events = [{"kind": e.kind, "t": e.t, "notebook": e.notebook, "pid": e.pid, **e.fields} for e in record.events]
    return learner_row(fetched, events, record.problems, stuck_after)


def sort_rows(rows: list[ProgressRow]) -> list[ProgressRow]:
    """Stuck learners first, then by state (ORDER), then by name."""
    return sorted(rows, key=lambda r: (ORDER.index(r.state), r.user))
