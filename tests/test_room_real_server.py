"""The room against a real jupyter_server (issue 46, items 9 and 10, as the review asked): its requests are not the
learner's activity (``/api/status``'s last_activity, which the idle culler's hub-side view follows through
jupyterhub-singleuser, stays put; a request without ``no_track_activity`` moves it), and the contents API serves the
record through the link ppkit makes under a root inside the home (``<root>/ppkit-progress -> ~/ppkit-progress``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from hub_testbed import free_port

from ppkit.room.hub_api import LearnerServer, timestamp
from ppkit.room.progress_fetch import fetch_learner
from ppkit.room.progress_rows import row_of

pytestmark = pytest.mark.slow
TOKEN = "room-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A jupyter_server rooted at ~/notebooks, ~/ppkit-progress holding a record, linked under the root."""
    home = tmp_path_factory.mktemp("home")
    (home / "notebooks").mkdir()
    (home / "ppkit-progress").mkdir()
    line = {"v": 1, "t": time.time() - 60, "kind": "check", "notebook": None, "pid": 7, "exercise": "my_share",
            "status": "passed"}
    (home / "ppkit-progress" / "record.jsonl").write_text(json.dumps(line) + "\n")
    os.symlink(home / "ppkit-progress", home / "notebooks" / "ppkit-progress")
    port = free_port()
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime")}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
                             "--ip=127.0.0.1", f"--ServerApp.token={TOKEN}", f"--ServerApp.root_dir={home}/notebooks",
                             "--ServerApp.port_retries=0", "--allow-root"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                get(base, "/api/status?no_track_activity=1")
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("jupyter_server did not answer within 120 s")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def get(base: str, path: str):
    req = urllib.request.Request(base + path, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def activity(base: str) -> float:
    return timestamp(get(base, "/api/status?no_track_activity=1")["last_activity"])


def test_the_rooms_requests_leave_the_learners_activity_alone_and_read_the_record_through_the_link(server):
    before = activity(server)
    time.sleep(1.5)  # jupyter_server's times have microseconds: any request after this would show
    fetched = fetch_learner(LearnerServer("ana", server + "/", True, None, False), TOKEN, timeout=60)
    assert fetched.server == "running" and fetched.problems == [], fetched.problems
    assert '"exercise": "my_share"' in fetched.texts["record.jsonl"]  # served through <root>/ppkit-progress
    assert row_of(fetched).exercises["(no notebook)"]["passed"] == ["my_share"]
    assert activity(server) == before, "a request of the room moved the learner's last_activity"
    get(server, "/api/sessions")  # the same request without no_track_activity: her activity, as the test's control
    assert activity(server) > before
