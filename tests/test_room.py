"""``ppkit preflight --json`` and ``ppkit room``'s rows, table and errors (the real hub run is in
tests/browser/test_hub_in_lab.py)."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
import sys

import pytest

from ppkit.preflight_report import CheckResult, PreflightReport
from ppkit.room.collect import MARK, RoomRow, row_from_answer, row_from_report
from ppkit.room.hub_api import HubClient, HubError
from ppkit.room.table import as_json, render

OK = CheckResult("python", "ok", "3.11.7")


def report(*checks: CheckResult, ok: bool = True) -> PreflightReport:
    return PreflightReport("ana", "hub-1", ok, "ppkit preflight: summary", (OK, *checks))


def answer(stdout: str = "", stderr: str = "", returncode: int | None = 0) -> str:
    """What the collecting code prints in a learner's kernel."""
    return "some kernel chatter\n" + MARK + json.dumps({"returncode": returncode, "stdout": stdout,
                                                         "stderr": stderr}) + "\n"


@pytest.mark.slow
def test_preflight_json_is_one_object_with_every_check():
    done = subprocess.run([sys.executable, "-m", "ppkit", "preflight", "--json"], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    parsed = PreflightReport.from_json(done.stdout)  # stdout holds the JSON alone; the check lines go to stderr
    assert parsed.ok and parsed.user == getpass.getuser() and parsed.host == socket.gethostname()
    assert [c.name for c in parsed.checks][:3] == ["python", "torch", "torchvision"]
    assert "pipeline" in {c.name for c in parsed.checks}
    assert parsed.summary.startswith("ppkit preflight: ") and parsed.summary in done.stderr
    assert PreflightReport.from_json(parsed.to_json()) == parsed


@pytest.mark.parametrize("text, says", [
    ("ppkit preflight: 10/10 ok", "not JSON"),
    ('{"checks": []}', "not a ppkit preflight report"),
    ('{"ppkit_preflight": 1, "user": "ana"}', "without 'checks'"),
])
def test_a_report_that_is_not_one_says_what_was_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        PreflightReport.from_json(text)


def test_rows_say_who_is_not_ready_and_why():
    failed = CheckResult("cluster", "FAIL", "TimeoutError: worker1 did not join", "run `ppkit doctor`")
    skipped = CheckResult("pipeline", "skip", "needs cluster, which failed above")
    row = row_from_report("ana", report(failed, skipped, ok=False))
    assert row.state == "not ready" and not row.ready
    assert row.why == ("cluster FAIL: TimeoutError: worker1 did not join (fix: run `ppkit doctor`); "
                       "pipeline skip: needs cluster, which failed above")
    warned = row_from_report("bo", report(CheckResult("machine", "warn", "1 core(s) (CPU_LIMIT=1)")))
    assert warned.state == "warnings" and warned.ready and warned.why == "machine: 1 core(s) (CPU_LIMIT=1)"
    assert row_from_report("cy", report()).state == "ready"


def test_answers_from_a_learners_kernel():
    good = row_from_answer("ana", answer(stdout=report().to_json() + "\n"))
    assert good.state == "ready" and good.report == report()
    missing = row_from_answer("bo", answer(stderr="/usr/bin/python: No module named ppkit\n", returncode=1))
    assert missing.state == "not ready" and "ppkit is not installed in the learner's kernel" in missing.why
    crashed = row_from_answer("cy", answer(stderr="Traceback ...\nMemoryError\n", returncode=1))
    assert crashed.why == "ppkit preflight --json exited 1: MemoryError"
    silent = row_from_answer("di", "Killed\n")
    assert silent.state == "unreachable" and "printed no answer: 'Killed'" in silent.why


def test_table_puts_who_is_not_ready_first_and_counts():
    rows = [RoomRow("ana", "ready", "ppkit preflight: 10/10 ok"), RoomRow("bo", "no server", "server not running"),
            RoomRow("cy", "not ready", "cluster FAIL: " + "x" * 300), RoomRow("di", "warnings", "machine: 1 core")]
    lines = render(rows, width=80).splitlines()
    assert [line.split()[0] for line in lines[2:-1]] == ["cy", "bo", "di", "ana"]
    assert all(len(line) <= 80 for line in lines) and lines[2].endswith("...")
    assert lines[-1] == "2/4 ready, 1 not ready, 1 no server"
    assert [r["ready"] for r in json.loads(as_json(rows))] == [True, False, False, True]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


def test_an_unreachable_hub_says_which_address_and_what_to_check():
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(HubError, match=rf"cannot reach the hub at {url}/hub/api/users.*check --hub-url"):
        HubClient(url, "token", timeout=5).users()
    done = subprocess.run([sys.executable, "-m", "ppkit", "room", "--hub-url", url, "--token", "t"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot reach the hub" in done.stderr and "Traceback" not in done.stderr


def test_room_without_a_token_says_where_to_get_one():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "ppkit", "room", "--hub-url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "/hub/token" in done.stderr
