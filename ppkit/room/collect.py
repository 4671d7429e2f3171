"""One row per learner: their ``ppkit preflight --json``, run in their own server, or why it could not run."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from ppkit.preflight_report import PreflightReport
from ppkit.room.hub_api import HubClient, LearnerServer
from ppkit.room.kernel_exec import KernelRunError, run_code

MARK = "PPKIT-ROOM "
# Runs in the learner's kernel: the preflight in a fresh process of the kernel's own Python, so the RPC
# world it starts never meets one of the learner's, and a missing ppkit shows as that, not as a crash here.
PREFLIGHT_CODE = """\
import json as _json, subprocess as _subprocess, sys as _sys
try:
    _p = _subprocess.run([_sys.executable, "-m", "ppkit", "preflight", "--json"], capture_output=True, text=True,
                         timeout={timeout})
    _answer = {{"returncode": _p.returncode, "stdout": _p.stdout[-50000:], "stderr": _p.stderr[-3000:]}}
except _subprocess.TimeoutExpired:
    _answer = {{"returncode": None, "stdout": "", "stderr": "ppkit preflight did not finish within {timeout} s"}}
print({mark!r} + _json.dumps(_answer))
"""


@dataclass(frozen=True)
class RoomRow:
    user: str
    state: str  # "ready", "warnings", "not ready", "no server", "unreachable"
    why: str  # one line: what is wrong and what to do, or the preflight's summary when all is well
    report: PreflightReport | None = None

    @property
    def ready(self) -> bool:
        return self.state in ("ready", "warnings")


def row_from_report(user: str, report: PreflightReport) -> RoomRow:
    if report.problems:
        why = "; ".join(f"{c.name} {c.status}: {c.detail}" + (f" (fix: {c.fix})" if c.fix else "")
                        for c in report.problems)
        return RoomRow(user, "not ready", why, report)
    if report.warnings:
        why = "; ".join(f"{c.name}: {c.detail}" for c in report.warnings)
        return RoomRow(user, "warnings", why, report)
    return RoomRow(user, "ready", report.summary, report)


def row_from_answer(user: str, stdout: str) -> RoomRow:
    """Read what PREFLIGHT_CODE printed in the learner's kernel."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        return RoomRow(user, "unreachable", f"the kernel printed no answer: {stdout.strip()[-300:]!r}")
    answer = json.loads(lines[-1][len(MARK):])
    out = answer["stdout"].strip()
    try:
        return row_from_report(user, PreflightReport.from_json(out.splitlines()[-1] if out else ""))
    except ValueError:
        err = answer["stderr"].strip().splitlines()
        last = err[-1] if err else "(nothing on stderr)"
        if "No module named ppkit" in answer["stderr"]:
            last = ("ppkit is not installed in the learner's kernel: install the course's wheel (pip install "
                    "ppkit-*.whl, not PyPI's `ppkit`) in the hub's user environment")
        return RoomRow(user, "not ready", f"ppkit preflight --json exited {answer['returncode']}: {last}")


async def _row(user: LearnerServer, token: str, timeout: float, slots: asyncio.Semaphore) -> RoomRow:
    if user.url is None or not user.ready:
        state = f"the hub is busy with it ({user.pending})" if user.pending else "not running"
        return RoomRow(user.name, "no server", f"server {state}: the learner has not logged in yet, or it was "
                       "stopped; `ppkit room --start` starts it")
    async with slots:
        try:
            out = await run_code(user.url, token, PREFLIGHT_CODE.format(timeout=int(timeout), mark=MARK),
                                 timeout=timeout + 30)
        except KernelRunError as exc:
            return RoomRow(user.name, "unreachable", f"{exc}; is the server overloaded, or the token's "
                           "access:servers scope missing?")
    if out.error:
        return RoomRow(user.name, "unreachable", f"the collecting code raised {out.error}")
    return row_from_answer(user.name, out.stdout)


async def _rows(users: list[LearnerServer], token: str, timeout: float, parallel: int) -> list[RoomRow]:
    slots = asyncio.Semaphore(max(1, parallel))
    return list(await asyncio.gather(*(_row(u, token, timeout, slots) for u in users)))


def collect(hub: HubClient, names: list[str] | None = None, start: bool = False, parallel: int = 4,
            timeout: float = 180.0) -> list[RoomRow]:
    """The room: a row for each user of the hub (or each of `names`), admins left out unless named.

    start: start the servers that are not running first (needs the admin:servers scope).
    parallel: how many preflights run at once; each starts 2 ranks and an RPC world on the hub's machine.
    """
    users = hub.users()
    known = {u.name for u in users}
    rows = [RoomRow(name, "unreachable", "no such user on this hub") for name in names or [] if name not in known]
    users = [u for u in users if (u.name in names if names else not u.admin)]
    if start:
        users = [u if u.ready else hub.start_server(u.name) for u in users]
    return rows + asyncio.run(_rows(users, hub.token, timeout, parallel))
