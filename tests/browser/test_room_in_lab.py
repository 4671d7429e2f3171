"""The instructor's live view of a room (issues 41 and 46), on a real JupyterHub with two learners whose servers are
rooted in ~/notebooks (c.Spawner.notebook_dir, common on workshop hubs: the record must still be found there).

Learner A works in her own server's kernels as she would in a notebook (a session of notebooks/06_pipeline.ipynb,
started through her server's REST API): she passes one exercise with `workbook.check` and fails another, and leaves
a second notebook's kernel busy. The instructor's `ppkit room --progress --json` (the real CLI) must show her two
outcomes, her busy kernel with its seconds and nothing passed for learner B, in seconds; learner B cannot open A's
record; a garbage or huge record, a wrong hub address and a wrong token each give a row or a message that says so.
Then the instructor opens the live page (`ppkit room --serve`, the hub's managed service ppkit-room) through the
hub's login, sees both rows, and sees A's next pass appear without a reload; learner B is refused (403). The page
runs as an unprivileged user. Last, learner B is active (a request of hers): the room polls her (the proxy's
activity of her route moves); once idle past --idle-after her row says "idle ... not polled" and that activity stays
put; then jupyterhub-idle-culler (30 s timeout) culls her server while the instructor keeps the page open: the room's
polling never keeps a server alive.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from hub_testbed import HubMissing, HubTestbed, find_components
from live_kernel import run_in_kernel

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "06_pipeline.ipynb"  # the servers' root is ~/notebooks: paths are relative to it
BUSY_NOTEBOOK = "01_point_to_point.ipynb"
CULL_TIMEOUT_S = 30
PAGE_TIMEOUT = 120_000  # ms
ARTIFACTS = REPO / "artifacts" / "browser"  # as tests/browser/conftest.py keeps them (git-ignored)
SCREENSHOT = ARTIFACTS / "room-live.png"

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

PASS_ONE_FAIL_ONE = """
from ppkit.exercises import workbook
from ppkit.exercises.solutions import pipeline_time
workbook.check("pipeline_time", pipeline_time)
def best_num_microbatches(forward, backward, fixed_seconds, overhead_seconds, candidates):
    return candidates[0]  # wrong: ignores the costs
workbook.check("best_num_microbatches", best_num_microbatches)
"""
PASS_THE_OTHER = """
from ppkit.exercises.solutions import best_num_microbatches
workbook.check("best_num_microbatches", best_num_microbatches)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    try:
        find_components()
    except HubMissing as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{exc} CI=true, so the JupyterHub test must run: `make hub` installs the proxy.")
        pytest.skip(f"{exc} Until then the JupyterHub test is skipped.")
    # the hub copies the proxy's activity every 5 s (300 s by default), so the culler sees what the room's polling does
    with HubTestbed(tmp_path_factory.mktemp("hub"), learners=2, room_service=True, activity_interval=5) as testbed:
        for name in testbed.names:
            testbed.start_server(name)
        yield testbed


def server_api(hub: HubTestbed, name: str, method: str, path: str, body: dict | None = None):
    req = urllib.request.Request(f"{hub.url}/user/{name}/api{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"token {hub.token}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def open_session(hub: HubTestbed, name: str, notebook: str) -> str:
    """What opening a notebook in JupyterLab does: a session for its path, with a kernel; the kernel's id."""
    # JupyterLab names the session by the file's name: the kernel's JPY_SESSION_NAME is then its path on disk
    session = server_api(hub, name, "POST", "/sessions", {"path": notebook, "type": "notebook",
                                                          "name": notebook.rsplit("/", 1)[-1],
                                                          "kernel": {"name": "python3"}})
    return session["kernel"]["id"]


def run_in(hub: HubTestbed, name: str, kernel: str, code: str, timeout: float | None = 300):
    """Run `code` in a kernel of `name`'s server; in a thread of its own, as Playwright's loop holds this one."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(run_in_kernel(f"{hub.url}/user/{name}/", hub.token, kernel, code,
                                                             timeout))).result()


def room(hub: HubTestbed, *options: str, url: str | None = None, token: str | None = None):
    """`ppkit room --progress --users A B` as the instructor runs it (the hub's other user is the instructor, who
    has no server: a room would list them as such); (the CompletedProcess, its seconds)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    cmd = [sys.executable, "-m", "ppkit", "room", "--hub-url", url or hub.url, "--token", token or hub.token,
           "--progress", "--users", *hub.names, *options]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return done, time.monotonic() - started


def rows_of(done) -> dict[str, dict]:
    assert done.returncode in (0, 1), f"ppkit room exited {done.returncode}: {done.stderr[-2000:]}"
    return {row["user"]: row for row in json.loads(done.stdout)["learners"]}


@pytest.fixture(scope="module")
def learner_a(hub):
    """A's work: one pass and one failure in 06_pipeline's kernel, and 01's kernel left busy."""
    a = hub.names[0]
    kernel = open_session(hub, a, NOTEBOOK)
    out = run_in(hub, a, kernel, PASS_ONE_FAIL_ONE)
    assert out.error and out.error.startswith("ExerciseFailed"), out  # the wrong answer's cell raises
    busy = open_session(hub, a, BUSY_NOTEBOOK)
    run_in(hub, a, busy, "import time\ntime.sleep(600)", timeout=None)
    yield {"name": a, "kernel": kernel, "busy": busy}
    try:
        server_api(hub, a, "POST", f"/kernels/{busy}/interrupt")
    except (urllib.error.HTTPError, urllib.error.URLError):
        pass  # the idle culler stopped her server (the last test): nothing runs on


def test_the_room_shows_what_a_learner_passed_failed_and_left_busy(hub, learner_a):
    a, b = hub.names
    time.sleep(3)  # the busy kernel has been busy a few seconds
    done, seconds = room(hub, "--json")
    print(f"ppkit room --progress --json, two learners on this hub: {seconds:.1f} s")
    rows = rows_of(done)
    assert set(rows) == {a, b}
    assert rows[a]["exercises"][NOTEBOOK] == {"passed": ["pipeline_time"], "failed": ["best_num_microbatches"],
                                              "not_tried": []}, rows[a]
    failure = next(x for x in rows[a]["attempts"] if x["exercise"] == "best_num_microbatches")
    assert failure["status"] == "failed" and failure["last_failure"], failure
    busy = next(n for n in rows[a]["notebooks"] if n["path"] == BUSY_NOTEBOOK)
    assert busy["kernel"] == "busy" and busy["busy_s"] >= 2, rows[a]["notebooks"]
    assert not any(e["passed"] for e in rows[b]["exercises"].values()) and rows[b]["state"] == "no record", rows[b]
    assert seconds < 10, f"ppkit room --progress took {seconds:.1f} s for two learners"
    # stuck after 0 minutes: the failure and the busy kernel both count, and A comes first
    stuck = rows_of(room(hub, "--json", "--stuck-after", "0")[0])
    assert stuck[a]["state"] == "stuck" and any("busy" in s for s in stuck[a]["stuck"]), stuck[a]
    table, _ = room(hub, "--stuck-after", "0")
    assert table.returncode == 1 and table.stdout.splitlines()[2].startswith(a), table.stdout


def test_another_learner_cannot_read_her_record(hub, learner_a):
    a, b = hub.names
    record = Path(pwd.getpwnam(a).pw_dir) / "notebooks" / "ppkit-progress" / "record.jsonl"  # under the root
    assert record.stat().st_uid == pwd.getpwnam(a).pw_uid and "pipeline_time" in record.read_text()
    code = f"open({str(record)!r}).read()"
    done = subprocess.run(["runuser", "-u", b, "--", sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert done.returncode != 0 and "PermissionError" in done.stderr, done.stdout + done.stderr


def test_garbage_a_huge_record_a_wrong_address_and_a_wrong_token_say_so(hub, learner_a):
    a = hub.names[0]
    record = Path(pwd.getpwnam(a).pw_dir) / "notebooks" / "ppkit-progress" / "record.jsonl"
    kept = record.read_bytes()
    try:
        record.write_bytes(b"\x7fELF not a record\n{]\n" * 3)
        row = rows_of(room(hub, "--json")[0])[a]
        assert row["state"] == "bad record" and "line(s) not JSON" in row["why"], row
        with open(record, "wb") as f:
            f.truncate(20 * 2**20)
        row = rows_of(room(hub, "--json")[0])[a]
        assert row["state"] == "bad record" and "record.jsonl is 20.0 MiB" in row["why"], row
    finally:
        record.write_bytes(kept)
    wrong_url, _ = room(hub, url=hub.url + "/not-the-hub")
    assert wrong_url.returncode == 2 and "No JupyterHub API there: is --hub-url" in wrong_url.stderr, wrong_url.stderr
    wrong_token, _ = room(hub, token="0" * 32)
    assert wrong_token.returncode == 2 and "does not know this token" in wrong_token.stderr, wrong_token.stderr


def wait_for_cells(page, user: str, cells: dict[int, str], timeout: float) -> None:
    """Wait until the cells of `user`'s row (by column) read `cells`; say what they read if they never do."""
    script = (f"() => {{ const r = document.querySelector(\"tr.learner[data-user='{user}']\"); return r !== null && "
              + " && ".join(f"r.children[{i}].textContent === {text!r}" for i, text in cells.items()) + "; }")
    try:
        page.wait_for_function(script, timeout=timeout)
    except Exception:
        row = page.locator(f"tr.learner[data-user='{user}']")
        raise AssertionError(f"{user}'s row never read {cells}: {row.inner_text() if row.count() else '(none)'}; "
                             f"status: {page.locator('#status').inner_text()}") from None


def test_the_live_page_shows_the_room_and_a_pass_without_a_reload(hub, learner_a, browser):
    a, b = hub.names
    ctx = browser.new_context(viewport={"width": 1400, "height": 700})
    ctx.route(re.compile(r"^(https?|wss?)://(?!(127\.0\.0\.1|localhost)[:/])"), lambda route: route.abort())
    try:
        page = ctx.new_page()
        page.goto(f"{hub.url}/services/ppkit-room/", timeout=PAGE_TIMEOUT)  # -> the hub's login -> back
        page.fill("#username_input", hub.instructor)
        page.fill("#password_input", hub.password)
        page.click("#login_submit")
        page.wait_for_url(re.compile(r"/services/ppkit-room/"), timeout=PAGE_TIMEOUT)
        row_a = page.locator(f"tr.learner[data-user='{a}']")
        row_a.wait_for(timeout=60_000)
        page.locator(f"tr.learner[data-user='{b}']").wait_for(timeout=10_000)
        # her pass and her failure (a collection from before her checks may show first; the next one has them)
        wait_for_cells(page, a, {2: "1", 3: "1"}, timeout=30_000)
        row_a.click()  # the details: which exercise failed, and why
        details = page.locator(f"tr.details[data-user='{a}']")
        assert "best_num_microbatches (06_pipeline): failed" in details.inner_text()
        page.evaluate("window.notReloaded = true")
        run_in(hub, a, learner_a["kernel"], PASS_THE_OTHER)
        started = time.monotonic()
        wait_for_cells(page, a, {2: "2", 3: "0"}, timeout=30_000)
        print(f"the live page showed A's pass {time.monotonic() - started:.1f} s after her check returned")
        assert page.evaluate("window.notReloaded === true")  # redrawn in place, not reloaded
        assert "best_num_microbatches (06_pipeline): passed" in details.inner_text()  # still open
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))
    finally:
        ctx.close()
    ctx = browser.new_context()  # learner B, who is not the instructor
    ctx.route(re.compile(r"^(https?|wss?)://(?!(127\.0\.0\.1|localhost)[:/])"), lambda route: route.abort())
    try:
        page = ctx.new_page()
        page.goto(f"{hub.url}/services/ppkit-room/", timeout=PAGE_TIMEOUT)
        page.fill("#username_input", b)
        page.fill("#password_input", hub.password)
        with page.expect_response(lambda r: r.status == 403, timeout=PAGE_TIMEOUT) as refused:
            page.click("#login_submit")
        print(f"learner B at the live page: {refused.value.status} at {refused.value.url}")
        assert "<h1>The room</h1>" not in page.content()
    finally:
        ctx.close()


def wait_until(done, seconds: float, failure: str) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, failure
        time.sleep(1)


def log_in_to_the_page(browser, hub: HubTestbed, user: str):
    ctx = browser.new_context(viewport={"width": 1400, "height": 700})
    ctx.route(re.compile(r"^(https?|wss?)://(?!(127\.0\.0\.1|localhost)[:/])"), lambda route: route.abort())
    page = ctx.new_page()
    page.goto(f"{hub.url}/services/ppkit-room/", timeout=PAGE_TIMEOUT)  # -> the hub's login -> back
    page.fill("#username_input", user)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    return ctx, page


def test_the_page_runs_unprivileged_and_an_idle_learners_server_is_culled_while_it_stays_open(hub, browser):
    b = hub.names[1]
    service = [p for p in psutil.process_iter(["cmdline", "uids"])
               if "--serve" in (p.info["cmdline"] or []) and hub.url in (p.info["cmdline"] or [])]
    assert service and all(p.info["uids"].real == pwd.getpwnam(hub.service_user.name).pw_uid for p in service), (
        [(p.pid, p.info["uids"]) for p in service])
    ctx, page = log_in_to_the_page(browser, hub, hub.instructor)
    culler = None
    try:
        row_b = page.locator(f"tr.learner[data-user='{b}']")
        row_b.wait_for(timeout=60_000)
        # B active: a request of hers (no no_track_activity) moves her server's own activity; the room polls her
        server_api(hub, b, "GET", "/sessions")
        polled = hub.route_activity(b)
        wait_until(lambda: hub.route_activity(b) != polled, 30, f"the room never polled active learner {b}")
        print(f"active learner B polled: the proxy's activity of her route moved from {polled}")
        wait_until(lambda: "not polled" not in row_b.inner_text(), 30,  # the row of a look at her, not a kept one
                   f"{b}'s row still says she is idle and not polled: {row_b.inner_text()}")
        # idle past --idle-after (15 s): her row says so, and the room stops asking (the proxy's activity stays)
        wait_until(lambda: "not polled" in row_b.inner_text(), 90,
                   f"{b}'s row never said she is idle and not polled: {row_b.inner_text()}")
        time.sleep(5)  # the last poll's answer, if one was on its way
        still = hub.route_activity(b)
        time.sleep(12)  # six of the room's collections (--every 2)
        assert hub.route_activity(b) == still, f"the room still polls idle learner {b}"
        print(f"idle learner B: not polled, the proxy's activity of her route stayed at {still}; row: "
              f"{row_b.inner_text()!r}")
        culler = subprocess.Popen([sys.executable, "-m", "jupyterhub_idle_culler", f"--url={hub.url}/hub/api",
                                   f"--timeout={CULL_TIMEOUT_S}", "--cull-every=5"],
                                  env=dict(os.environ, JUPYTERHUB_API_TOKEN=hub.token),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.monotonic()
        while hub.server_running(b):
            waited = time.monotonic() - started
            assert waited < 8 * CULL_TIMEOUT_S, (
                f"{b}'s server, idle, was not culled within {waited:.0f} s of a {CULL_TIMEOUT_S} s culler while the "
                f"room's page stayed open; page: {page.locator('#status').inner_text()}")
            time.sleep(2)
        status = page.locator("#status").inner_text()
        print(f"idle learner B culled {time.monotonic() - started:.0f} s after the page showed her row; "
              f"the page meanwhile: {status}")
        assert "cannot refresh" not in status, status  # the page itself kept refreshing all along
    finally:
        if culler is not None:
            culler.terminate()
            culler.wait(timeout=30)
        ctx.close()
