"""``ppkit room --progress``'s fetch, rows, table, JSON and CSV against a small fake hub and Jupyter server
on loopback (the real hub run is tests/browser/test_room_in_lab.py)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from hub_testbed import free_port

from ppkit.room.hub_api import HubClient, HubError, LearnerServer
from ppkit.room.progress import collect_progress
from ppkit.room.progress_fetch import MAX_RECORD_BYTES, Fetched, fetch_learner
from ppkit.room.progress_rows import row_of
from ppkit.room.progress_table import as_csv, as_json, exercise_summary, render

NOW = 1_790_000_000.0
NB = "notebooks/06_pipeline.ipynb"
TOKEN = "instructor-token"


ON_DISK = "/home/ana/" + NB  # what a kernel records (JPY_SESSION_NAME); /api/sessions says NB


def line(kind: str, t: float, notebook: str | None = ON_DISK, pid: int = 41, **fields) -> str:
    return json.dumps({"v": 1, "t": t, "kind": kind, "notebook": notebook, "pid": pid, **fields}) + "\n"


ANA = "".join([
    line("check", NOW - 900, exercise="pipeline_time", status="failed", reason="case 2: expected 7.0, got 6.0"),
    line("check", NOW - 840, exercise="pipeline_time", status="passed"),
    line("check", NOW - 600, exercise="best_num_microbatches", status="not written"),
    line("check", NOW - 420, exercise="best_num_microbatches", status="failed", reason="case 1: expected 4, got 8"),
    line("error", NOW - 400, error="WorkerError", message="rank 1 raised ValueError: bad shape"),
    line("cluster", NOW - 300, pid=42, state="hung", seconds=61.5, detail="ranks 0,1 wait in all_reduce"),
    line("preflight", NOW - 1000, notebook=None, verdict="warnings", summary="9/10 ok, 1 warning"),
])


def iso(t: float) -> str:
    """As jupyter_server writes last_activity: ISO 8601 in UTC, with a Z."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


SESSIONS = [{"path": NB, "kernel": {"execution_state": "busy", "last_activity": iso(NOW - 340)}},
            {"path": "notebooks/01_point_to_point.ipynb", "kernel": {"execution_state": "idle",
                                                                       "last_activity": iso(NOW - 20)}}]


class FakeHub(BaseHTTPRequestHandler):
    """/hub/api/users, /hub/api/user and each learner's /user/NAME/api/{sessions,contents}: `files` per user."""

    files: dict[str, dict[str, str | int]] = {}  # user -> {name: text, or an int: only a listed size}
    down: set[str] = set()
    delay = 0.0  # s each learner's server takes to answer
    asked: list[str] = []  # each request to a learner's server, path and query
    own_activity: dict[str, float] = {}  # user -> her server's own last_activity (/api/status), default NOW - 5
    hub_activity: dict[str, float] = {}  # user -> the hub's last_activity of her server (default: none given)
    busy = {"now": 0, "most": 0}  # requests to learners' servers being answered at once
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def date_time_string(self, timestamp=None):  # the Date header: this server's clock is at NOW
        return formatdate(NOW, usegmt=True)

    def _send(self, code: int, body) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802 - http.server's name
        path = urlparse(self.path).path
        if self.headers.get("Authorization") == "token limited":  # a real token without list:users
            if path == "/hub/api/user":
                return self._send(200, {"kind": "service", "name": "grader", "scopes": ["read:users"]})
            return self._send(403, {"message": "Action is not authorized with current scopes"})
        if self.headers.get("Authorization") == "token no-read-servers" and path == "/hub/api/users":
            return self._send(200, {"items": [{"name": n, "admin": False} for n in self.files]})
        if self.headers.get("Authorization") != f"token {TOKEN}":
            return self._send(403, {"message": "Missing or invalid credentials"})
        if path == "/hub/api/users":
            return self._send(200, {"items": [{"name": n, "admin": False, "servers": {"": {
                "url": f"/user/{n}/", "ready": True, "last_activity": iso(self.hub_activity[n])
                if n in self.hub_activity else None}}} for n in [*self.files, *self.down]]})
        parts = path.split("/")  # "", "user", NAME, "api", ...
        if parts[1] != "user":
            return self._send(404, {"message": "Not Found"})
        with self.lock:
            self.asked.append(self.path)
            self.busy["now"] += 1
            self.busy["most"] = max(self.busy["most"], self.busy["now"])
        try:
            time.sleep(self.delay)
            return self._learner(parts[2], "/".join(parts[4:]))
        finally:
            with self.lock:
                self.busy["now"] -= 1

    def _learner(self, user: str, rest: str):
        if user in self.down:
            return self._send(503, {"message": "server not running"})
        files = self.files[user]
        if rest == "status":
            return self._send(200, {"last_activity": iso(self.own_activity.get(user, NOW - 5)), "kernels": 1})
        if rest == "sessions":
            return self._send(200, SESSIONS if files else [])
        if rest == "contents/ppkit-progress":
            if not files:
                return self._send(404, {"message": "No such directory"})
            return self._send(200, {"type": "directory", "content": [
                {"name": n, "size": v if isinstance(v, int) else len(v.encode()),
                 "last_modified": iso(NOW - len(str(v)))} for n, v in files.items()]})
        name = rest.rsplit("/", 1)[-1]
        if isinstance(files.get(name), int):
            raise AssertionError(f"{name} of {files[name]} bytes was fetched although it is over the cap")
        return self._send(200, {"type": "file", "format": "text", "content": files[name]})


@pytest.fixture
def hub_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    FakeHub.files, FakeHub.down, FakeHub.delay, FakeHub.busy = {}, set(), 0.0, {"now": 0, "most": 0}
    FakeHub.asked, FakeHub.own_activity, FakeHub.hub_activity = [], {}, {}


def learner(url: str, name: str) -> LearnerServer:
    return LearnerServer(name, f"{url}/user/{name}/", True, None, False)


def test_a_learner_who_passed_one_and_fails_another_is_stuck_with_the_reasons(hub_url):
    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    row = row_of(fetch_learner(learner(hub_url, "ana"), TOKEN), stuck_after=5)
    assert row.state == "stuck"
    assert row.exercises[NB] == {"passed": ["pipeline_time"], "failed": ["best_num_microbatches"], "not_tried": []}
    assert row.exercises["notebooks/01_point_to_point.ipynb"]["not_tried"] == ["ring_shift"]
    assert row.stuck == ["failed best_num_microbatches 7 min ago, no pass since (case 1: expected 4, got 8)",
                         "kernel of 06_pipeline.ipynb busy 340 s",  # on the server's clock (its Date header)
                         "cluster hung 5 min ago: ranks 0,1 wait in all_reduce"]
    assert row.notebooks[0] == {"path": NB, "kernel": "busy", "busy_s": 340.0}
    assert row.last_error == {"error": "WorkerError", "message": "rank 1 raised ValueError: bad shape",
                              "notebook": NB, "ago_s": 400.0}
    assert row.preflight["verdict"] == "warnings" and row.problems == []
    # within the limit nothing is stuck: the failure is 7 min old, the kernel busy 340 s, but the cluster hung
    assert row_of(fetch_learner(learner(hub_url, "ana"), TOKEN), stuck_after=10).stuck == [row.stuck[2]]


def test_a_pass_after_a_failure_is_not_stuck_and_not_written_is_not_an_attempt(hub_url):
    FakeHub.files = {"bo": {"record.old.jsonl": line("check", NOW - 900, exercise="pipeline_time", status="failed",
                                                      reason="case 1"),
                            "record.jsonl": line("check", NOW - 60, exercise="pipeline_time", status="passed")
                            + line("check", NOW - 30, exercise="best_num_microbatches", status="not written")}}
    row = row_of(fetch_learner(learner(hub_url, "bo"), TOKEN), stuck_after=1)
    assert [(a.exercise, a.status, a.attempts, a.failures) for a in row.attempts] == [
        ("pipeline_time", "passed", 2, 1), ("best_num_microbatches", "not written", 0, 0)]
    assert row.exercises[NB]["not_tried"] == ["best_num_microbatches"]
    assert "kernel of 06_pipeline.ipynb busy 340 s" in row.stuck and len(row.stuck) == 1


def test_garbage_a_huge_file_a_missing_record_and_a_server_down_are_rows_that_say_so(hub_url):
    FakeHub.files = {"cy": {"record.jsonl": "not json\n[1, 2]\n" + line("check", NOW - 10, exercise="ring_shift",
                                                                         status="passed") + "\x00\x01 cut"},
                     "di": {"record.jsonl": 20 * 2**20}, "ed": {}}
    FakeHub.down = {"fy"}
    ordered = collect_progress(HubClient(hub_url, TOKEN), stuck_after=60)
    assert [r.user for r in ordered] == ["fy", "di", "ed", "cy"]  # unreachable, bad record, no record, ok
    rows = {r.user: r for r in ordered}
    assert sorted(rows["cy"].problems) == ["1 line(s) cut short at the end of a file", "1 line(s) not JSON",
                                           "1 line(s) not a JSON object"]
    assert rows["cy"].exercises[NB]["passed"] == ["ring_shift"] and rows["cy"].state == "ok"
    assert rows["di"].state == "bad record" and rows["di"].why == (
        f"ppkit-progress/record.jsonl is 20.0 MiB, over the {MAX_RECORD_BYTES // 2**20} MiB a ppkit record can "
        "reach: not read")
    assert rows["ed"].state == "no record" and "nothing recorded yet" in rows["ed"].why
    assert rows["fy"].state == "unreachable" and "answered 503" in rows["fy"].why
    assert "the hub has no running server behind /user/fy/" in rows["fy"].why


def test_a_wrong_token_and_a_wrong_address_say_which(hub_url):
    with pytest.raises(HubError, match=r"answered 403.*does not know this token.*/hub/token"):
        HubClient(hub_url, "wrong").users()
    with pytest.raises(HubError, match=r"answered 403.*service 'grader''s, which lacks a scope.*\['read:users'\]"):
        HubClient(hub_url, "limited").users()
    FakeHub.files = {"ana": {}}
    with pytest.raises(HubError, match=r"lists its users but not their servers to this token: give it the scope "
                                       r"read:servers"):
        HubClient(hub_url, "no-read-servers").users()
    with pytest.raises(HubError, match=r"answered 404.*No JupyterHub API there: is --hub-url"):
        HubClient(hub_url + "/elsewhere", TOKEN).users()


def test_table_json_and_csv_of_a_room(hub_url):
    FakeHub.files = {"ana": {"record.jsonl": ANA}, "bo": {}}
    rows = collect_progress(HubClient(hub_url, TOKEN), stuck_after=5)
    lines = render(rows, width=200).splitlines()
    assert [x.split()[:3] for x in lines[2:4]] == [["ana", "stuck", "1/1/1"], ["bo", "no", "record"]]
    assert "06_pipeline (busy 340 s)" in lines[2] and "failed best_num_microbatches 7 min ago" in lines[2]
    assert lines[2].split()[-2:] == ["hung", "warnings"]  # the last cluster state and the preflight verdict
    assert lines[-1] == "2 learner(s): 1 stuck, 1 no record" and all(len(x) <= 200 for x in lines)
    assert all(len(x) <= 80 for x in render(rows, width=80).splitlines())
    learners = json.loads(as_json(rows))["learners"]
    assert [r["user"] for r in learners] == ["ana", "bo"] and learners[0]["notebooks"][0]["busy_s"] == 340.0
    table = list(csv.DictReader(io.StringIO(as_csv(rows))))
    got = {(r["user"], r["exercise"]): r for r in table}
    assert got[("ana", "pipeline_time")]["minutes_to_pass"] == "1.0"
    assert got[("ana", "pipeline_time")]["last_failure_reason"] == "case 2: expected 7.0, got 6.0"
    assert got[("ana", "best_num_microbatches")]["status"] == "failed"
    assert got[("ana", "ring_shift")]["status"] == "not tried" and got[("bo", "")]["status"] == "no record"
    summary = exercise_summary(rows).splitlines()
    assert summary[1].split()[:6] == ["best_num_microbatches", "1", "0", "-", "1", "1x"]


def test_the_cli_prints_csv_and_the_summary_and_says_when_something_is_missing(hub_url):
    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ppkit", "room", "--hub-url", hub_url, "--token", TOKEN,
                           "--progress", "--csv"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1, done.stderr  # ana is stuck
    assert done.stdout.startswith("user,notebook,exercise,status,attempts") and "pipeline_time" in done.stderr
    print(f"ppkit room --progress --csv, one learner: {time.monotonic() - started:.1f} s")
    bad = subprocess.run([sys.executable, "-m", "ppkit", "room", "--hub-url", hub_url, "--token", TOKEN, "--csv"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "add --progress" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "ppkit", "room", "--hub-url", hub_url, "--token", TOKEN, "--start",
                          "--progress"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "--start is for the preflight" in bad.stderr
    serve = subprocess.run([sys.executable, "-m", "ppkit", "room", "--hub-url", hub_url, "--token", TOKEN,
                            "--serve"], capture_output=True, text=True, timeout=60,
                           env={k: v for k, v in env.items() if not k.startswith("JUPYTERHUB_")})
    assert serve.returncode == 2 and "JUPYTERHUB_SERVICE_PREFIX" in serve.stderr and "--progress" in serve.stderr


def test_the_live_pages_room_collects_and_says_why_a_collection_failed(hub_url):
    from ppkit.room.live_page import PAGE
    from ppkit.room.serve import Room

    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    room = Room(HubClient(hub_url, TOKEN), None, "ppkit-progress", 5)
    room.collect()
    got = json.loads(room.as_json())
    assert got["error"] is None and got["learners"][0]["user"] == "ana" and got["learners"][0]["state"] == "stuck"
    room.hub = HubClient(hub_url, "wrong")
    room.collect()
    got = json.loads(room.as_json())
    assert "does not know this token" in got["error"] and got["learners"][0]["user"] == "ana"  # the last rows stay
    assert "http" not in PAGE.replace("http-equiv", "")  # nothing loaded from elsewhere


def test_a_room_of_40_is_fetched_in_parallel(hub_url):
    FakeHub.files = {f"l{i:02d}": {"record.jsonl": ANA} for i in range(40)}
    FakeHub.delay = 0.2  # a loaded server: 3 requests per learner, 24 s one after the other
    started = time.monotonic()
    rows = collect_progress(HubClient(hub_url, TOKEN), stuck_after=5)
    print(f"40 learners, 0.2 s per request: {time.monotonic() - started:.1f} s, "
          f"{FakeHub.busy['most']} requests at once")
    assert len(rows) == 40 and all(r.state == "stuck" for r in rows)
    assert FakeHub.busy["most"] >= 8  # 16 learners at a time (a machine this loaded still starts 8 threads)


def test_the_timeout_is_per_learner_not_per_request(hub_url):
    """A slow server (1.5 s per request, 3 requests) with 2 s for the learner: given up after about 2 s and said so,
    not after 3 x 2 s."""
    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    FakeHub.delay = 1.5
    started = time.monotonic()
    fetched = fetch_learner(learner(hub_url, "ana"), TOKEN, timeout=2.0)
    took = time.monotonic() - started
    assert took < 3.4, f"one learner took {took:.1f} s with a 2 s timeout"
    assert any("time was up" in p or "timed out" in p for p in fetched.problems), fetched.problems


# -- item 8 of issue 46: a hung or died run is history once she moved on -------------------------------------

def kernel_of_06(state: str, last_activity: float) -> list[dict]:
    return [{"path": NB, "kernel": {"execution_state": state, "last_activity": iso(last_activity)}}]


def fetched(*lines: str, sessions: list[dict] | None = None) -> Fetched:
    open_06 = kernel_of_06("idle", NOW - 5)
    return Fetched("ana", "running", texts={"record.old.jsonl": None, "record.jsonl": "".join(lines)},
                   sessions=open_06 if sessions is None else sessions, now=NOW)


HUNG = [line("cluster", NOW - 300, state="running", detail="%%torchrun: 2 rank(s) started"),
        line("cluster", NOW - 290, state="hung", seconds=60.0, detail="every rank waits inside torch.distributed")]
STILL_HUNG = kernel_of_06("busy", NOW - 290)  # the hung cell's kernel: busy since its last output


def test_a_run_she_stopped_herself_with_kernel_interrupt_is_not_stuck():
    row = row_of(fetched(*HUNG, line("cluster", NOW - 280, state="stopped",
                                     detail="%%torchrun: stopped by Kernel > Interrupt")), stuck_after=1)
    assert row.state == "ok" and row.stuck == [], row.stuck
    assert row.cluster["state"] == "stopped"


def test_a_run_that_died_is_history_once_she_does_something_else_in_that_kernel():
    died = line("cluster", NOW - 200, state="died", detail="%%torchrun: rank 1 exited with code 7")
    ended = kernel_of_06("idle", NOW - 199.5)  # the kernel's last message: the died cell's end
    assert row_of(fetched(*HUNG[:1], died, sessions=ended), stuck_after=1).state == "stuck"  # nothing since
    own_error = line("error", NOW - 199.6, error="ProcessExitedError", message="rank 1 exited with code 7")
    assert row_of(fetched(*HUNG[:1], died, own_error, sessions=ended), stuck_after=1).state == "stuck"  # same cell
    row = row_of(fetched(*HUNG[:1], died, line("check", NOW - 100, exercise="pipeline_time", status="passed"),
                         sessions=ended), stuck_after=1)
    assert row.state == "ok" and row.stuck == [], row.stuck
    assert row.cluster["state"] == "died" and row.cluster["current"] is False  # still shown, as history


def test_a_died_run_is_history_once_its_kernel_ran_other_cells():
    """Cells that record nothing (plain Python, a plot) still move the kernel's last_activity: past the died run's
    cell (SAME_CELL_S), she has moved on."""
    died = line("cluster", NOW - 3600, state="died", detail="%%torchrun: rank 1 exited with code 7")
    row = row_of(fetched(*HUNG[:1], died, sessions=kernel_of_06("idle", NOW - 60)), stuck_after=5)
    assert row.stuck == [] and row.cluster["current"] is False, row.stuck


def test_a_hang_is_current_only_while_its_kernel_is_busy():
    assert row_of(fetched(*HUNG, sessions=STILL_HUNG), stuck_after=1).cluster["current"] is True
    # Kernel > Restart (the same session, idle now) or an interrupt that recorded nothing: not stuck any more
    row = row_of(fetched(*HUNG, sessions=kernel_of_06("idle", NOW - 250)), stuck_after=1)
    assert row.stuck == [] and row.cluster["current"] is False, row.stuck


def test_a_script_that_died_or_hung_is_history_after_stuck_after():
    for state in ("died", "hung"):
        trouble = line("cluster", NOW - 3600, notebook=None, pid=555, state=state, detail="spawn: rank 0 raised",
                       seconds=60.0)
        row = row_of(fetched(trouble), stuck_after=5)
        assert row.stuck == [] and row.cluster["current"] is False, (state, row.stuck)
        recent = line("cluster", NOW - 120, notebook=None, pid=555, state=state, detail="spawn: rank 0 raised",
                      seconds=60.0)
        assert row_of(fetched(recent), stuck_after=5).cluster["current"] is True, state


def test_a_hang_is_history_once_its_kernel_is_gone():
    # restarted: the same notebook's next event comes from another kernel (pid 43)
    row = row_of(fetched(*HUNG, line("check", NOW - 100, pid=43, exercise="pipeline_time", status="failed",
                                     reason="case 1"), sessions=STILL_HUNG), stuck_after=60)
    assert row.stuck == [] and row.cluster["current"] is False, row.stuck
    # closed: no session holds that notebook any more
    row = row_of(fetched(*HUNG, sessions=[]), stuck_after=60)
    assert row.stuck == [] and row.cluster["current"] is False, row.stuck
    # still open, its kernel busy, nothing since: the hang is current, and she is stuck
    row = row_of(fetched(*HUNG, sessions=STILL_HUNG), stuck_after=1)
    assert row.stuck[-1] == "cluster hung 5 min ago: every rank waits inside torch.distributed", row.stuck
    assert row.cluster["current"] is True
    # the sessions could not be read: whether the kernel is gone is not known, so the hang stays current
    unread = replace(fetched(*HUNG), sessions=None)
    assert row_of(unread, stuck_after=1).stuck == row.stuck[-1:]


# -- item 9 of issue 46: the room never keeps a server alive that the idle culler would stop -------------------

def record_gets() -> list[str]:
    return [a for a in FakeHub.asked if "/contents/ppkit-progress/" in a]


def test_no_request_of_the_room_counts_as_the_learners_activity(hub_url):
    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    collect_progress(HubClient(hub_url, TOKEN), stuck_after=5)
    assert FakeHub.asked and all("no_track_activity=1" in a for a in FakeHub.asked), FakeHub.asked


def test_the_live_page_fetches_a_record_file_only_when_the_listing_says_it_changed(hub_url):
    from ppkit.room.serve import Room

    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    room = Room(HubClient(hub_url, TOKEN), None, "ppkit-progress", 5)
    room.collect()
    room.collect()
    assert len(record_gets()) == 1, FakeHub.asked  # the second look: same size and time in the listing
    assert json.loads(room.as_json())["learners"][0]["exercises"][NB]["passed"] == ["pipeline_time"]
    FakeHub.files["ana"]["record.jsonl"] = ANA + line("check", NOW - 1, exercise="best_num_microbatches",
                                                      status="passed")
    room.collect()
    assert len(record_gets()) == 2
    assert json.loads(room.as_json())["learners"][0]["exercises"][NB]["passed"] == ["pipeline_time",
                                                                                   "best_num_microbatches"]


def test_an_idle_learner_is_not_polled_until_the_hub_sees_her_active_again(hub_url):
    from ppkit.room.serve import Room

    FakeHub.files = {"ana": {"record.jsonl": ANA}, "bo": {"record.jsonl": ANA}}
    FakeHub.own_activity = {"ana": NOW - 600}  # ana did nothing for 10 min; bo 5 s ago
    FakeHub.hub_activity = {"ana": time.time() - 600}  # what the hub last copied from the proxy for her
    room = Room(HubClient(hub_url, TOKEN), None, "ppkit-progress", 5, idle_after=5)
    room.collect()
    looked = len(FakeHub.asked)
    room.collect()
    polled = [a.split("/")[2] for a in FakeHub.asked[looked:]]
    assert "ana" not in polled and "bo" in polled, polled  # her server is left alone: the culler may stop it
    ana = next(r for r in json.loads(room.as_json())["learners"] if r["user"] == "ana")
    assert ana["state"] == "stuck" and "idle 10 min: not polled" in ana["why"], ana["why"]  # her last row stays
    FakeHub.hub_activity = {"ana": time.time() + 1}  # the hub saw her again, after the room's last look
    looked = len(FakeHub.asked)
    room.collect()
    assert any(a.startswith("/user/ana/") for a in FakeHub.asked[looked:])


def test_a_record_path_with_username_names_each_learners_own_folder(hub_url):
    """A shared root (every learner's server rooted at /srv/course, say) keeps each record in its own folder:
    --record-path "records/{username}" asks for records/ana from ana's server and records/bo from bo's."""
    FakeHub.files = {"ana": {"record.jsonl": ANA}, "bo": {"record.jsonl": ANA}}
    collect_progress(HubClient(hub_url, TOKEN), record_path="records/{username}", stuck_after=5)
    listed = sorted(a.split("?")[0] for a in FakeHub.asked if "/contents/" in a)
    assert listed == ["/user/ana/api/contents/records/ana", "/user/bo/api/contents/records/bo"], listed


def test_an_idle_learners_kept_row_ages_with_the_clock():
    """Her last look was 10 min ago, her kernel busy since 15 min: the kept row says busy 15 min, not 5 (frozen at
    the last look), and its idle time grows the same."""
    t0 = time.time()
    seen = Fetched("ana", "running", texts={"record.jsonl": None, "record.old.jsonl": None},
                   sessions=kernel_of_06("busy", t0 - 900), now=t0 - 600, own_activity=t0 - 900, looked_at=t0 - 600)
    quiet = LearnerServer("ana", "http://127.0.0.1:9/user/ana/", True, None, False, last_activity=t0 - 900)
    kept = fetch_learner(quiet, TOKEN, seen=seen, idle_after=120)
    assert kept.sessions == seen.sessions  # not asked again: her server is left alone
    row = row_of(kept, stuck_after=5)
    assert 895 <= row.notebooks[0]["busy_s"] <= 960, row.notebooks
    assert 895 <= kept.idle_s <= 960 and "idle 15 min" in row.why, row.why
    assert row.state == "stuck"  # busy 15 min is past stuck_after


def test_a_learner_whose_hub_activity_is_unknown_is_polled():
    t0 = time.time()
    seen = Fetched("ana", "running", now=t0 - 600, own_activity=t0 - 900, looked_at=t0 - 600)
    unknown = LearnerServer("ana", "http://127.0.0.1:9/user/ana/", True, None, False, last_activity=None)
    assert fetch_learner(unknown, TOKEN, seen=seen, idle_after=120, timeout=5).server == "unreachable"  # asked


def test_the_service_collects_nothing_while_nobody_has_the_page_open(hub_url, tmp_path):
    FakeHub.files = {"ana": {"record.jsonl": ANA}}
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), JUPYTERHUB_SERVICE_PREFIX="/services/ppkit-room/",
               JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{port}", JUPYTERHUB_API_TOKEN=TOKEN,
               JUPYTERHUB_API_URL=f"{hub_url}/hub/api", JUPYTERHUB_CLIENT_ID="service-ppkit-room")
    service = subprocess.Popen([sys.executable, "-m", "ppkit", "room", "--serve", "--hub-url", hub_url,
                                "--every", "0.5"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on 127.0.0.1:" in service.stderr.readline()
        time.sleep(4)  # eight collections' time, had it collected regardless
        assert FakeHub.asked == [], FakeHub.asked
    finally:
        service.terminate()
        service.wait(timeout=30)


# -- item 11 of issue 46: where the service listens --------------------------------------------------------

def test_a_service_url_naming_another_machine_says_to_bind_0000_and_bind_does(hub_url):
    from ppkit.room.serve import listen_address

    assert listen_address("http://127.0.0.1:10101", None) == ("127.0.0.1", 10101)
    assert listen_address("http://hub:10101", "0.0.0.0") == ("0.0.0.0", 10101)  # Z2JH: the URL is the k8s Service
    assert listen_address("http://hub:10101", "0.0.0.0:8181") == ("0.0.0.0", 8181)
    assert listen_address("http://hub:10101", "[::]:8181") == ("::", 8181)  # IPv6, bracketed as in a URL
    assert listen_address("http://hub:10101", "[::]") == ("::", 10101)
    assert listen_address("http://hub:10101", "::") == ("::", 10101)
    with pytest.raises(ValueError, match="the port after ':' must be a number"):
        listen_address("http://hub:10101", "0.0.0.0:port")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), JUPYTERHUB_SERVICE_PREFIX="/services/ppkit-room/",
               JUPYTERHUB_SERVICE_URL=f"http://192.0.2.1:{free_port()}", JUPYTERHUB_API_TOKEN=TOKEN,
               JUPYTERHUB_API_URL=f"{hub_url}/hub/api", JUPYTERHUB_CLIENT_ID="service-ppkit-room")
    serve = [sys.executable, "-m", "ppkit", "room", "--serve", "--hub-url", hub_url]
    done = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60)  # 192.0.2.1: not this machine
    assert done.returncode == 2 and "pass --bind 0.0.0.0" in done.stderr and "Traceback" not in done.stderr, (
        done.stderr[-2000:])
    service = subprocess.Popen([*serve, "--bind", "127.0.0.1"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening on 127.0.0.1:" in service.stderr.readline()
    finally:
        service.terminate()
        service.wait(timeout=30)
