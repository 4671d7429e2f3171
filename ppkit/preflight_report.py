"""``ppkit preflight --json``: the checks as one JSON object, for an instructor collecting a room's results.

    {"ppkit_preflight": 1, "user": "ana", "host": "hub-1", "ok": true,
     "summary": "ppkit preflight: 11/11 ok (...)", "checks": [{"name": "python", "status": "ok",
     "detail": "3.11.7 (tested: ...)", "fix": ""}, ...]}

``ok`` is the exit status's meaning: no check failed (warnings allowed). :class:`PreflightReport` reads it
back (``ppkit room`` does, for each learner of a hub) and says in one line why a learner is not ready.
"""

from __future__ import annotations

import getpass
import json
import socket
import sys
from dataclasses import asdict, dataclass

FORMAT_VERSION = 1
NOT_OK = ("FAIL", "skip")


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class PreflightReport:
    user: str
    host: str
    ok: bool
    summary: str
    checks: tuple[CheckResult, ...]

    @property
    def problems(self) -> tuple[CheckResult, ...]:
        """The checks that failed or could not run."""
        return tuple(c for c in self.checks if c.status in NOT_OK)

    @property
    def warnings(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status == "warn")

    def to_json(self) -> str:
        body = {"ppkit_preflight": FORMAT_VERSION, **asdict(self)}
        return json.dumps(body)

    @classmethod
    def from_json(cls, text: str) -> PreflightReport:
        """Parse what ``ppkit preflight --json`` printed; ValueError says what was wrong with it."""
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc}): {text[:200]!r}") from exc
        if not isinstance(body, dict) or body.get("ppkit_preflight") != FORMAT_VERSION:
            raise ValueError(f"not a ppkit preflight report of format {FORMAT_VERSION}: {text[:200]!r}")
        try:
            checks = tuple(CheckResult(c["name"], c["status"], c["detail"], c.get("fix", ""))
                           for c in body["checks"])
            return cls(body["user"], body["host"], bool(body["ok"]), body["summary"], checks)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a preflight report without {exc}: {text[:200]!r}") from exc


def run_report() -> PreflightReport:
    """Run every preflight check (their lines go to stderr, for a person watching) and return the report."""
    from ppkit.preflight import Preflight

    preflight = Preflight(emit=lambda line: print(line, file=sys.stderr, flush=True))
    checks = preflight.run()
    return PreflightReport(
        user=getpass.getuser(), host=socket.gethostname(), ok=preflight.ok, summary=preflight.summary(),
        checks=tuple(CheckResult(c.name, c.status, c.detail, c.fix) for c in checks),
    )
