"""The leftover check itself: it finds ppkit's processes by what ppkit set on them, not by a path that
happens to contain "ppkit" (a clone at ``.../ppkit/`` puts that in every command line of its venv)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from leftovers import end_leftovers, is_ppkit_process, ppkit_children, runs_ppkit, wait_gone

from ppkit.cluster.launchers.base import LAUNCHED_BY_ENV


@pytest.mark.parametrize("argv", [
    ["/x/bin/python", "-m", "ppkit", "worker", "--connect", "10.0.0.1:29600"],
    ["python3", "-u", "-m", "ppkit.transport.zygote"],
    ["/opt/venv/bin/python", "/opt/venv/bin/ppkit", "master", "--listen", "0.0.0.0:29600"],
])
def test_ppkit_programs_are_known_by_their_command(argv):
    assert runs_ppkit(argv) and is_ppkit_process(argv, {})


@pytest.mark.parametrize("argv", [
    ["/tmp/ppkit/.venv/bin/python", "/tmp/ppkit/.venv/bin/jupyterhub", "-f", "/tmp/ppkit/hub/config.py"],
    ["node", "/tmp/ppkit/node_modules/.bin/configurable-http-proxy", "--port", "8000"],
    ["/home/me/ppkit/.venv/bin/python", "-m", "ipykernel_launcher", "-f", "/tmp/kernel.json"],
    ["/home/me/ppkit-course/.venv/bin/python", "-m", "pytest", "tests"],
    ["python", "-m", "ppkitten"],
])
def test_a_path_that_contains_ppkit_is_not_a_ppkit_process(argv):
    assert not runs_ppkit(argv) and not is_ppkit_process(argv, {"PPKIT_TEST_OWNER": "1"})


def test_slurm_daemons_are_not_counted_even_with_the_mark():
    assert not is_ppkit_process(["/usr/sbin/slurmd", "-N", "n1"], {LAUNCHED_BY_ENV: "1"})


def test_an_unrelated_program_run_from_a_ppkit_folder_is_not_a_leftover(tmp_path):
    # As in a clone made by `git clone ... ppkit`: a venv's python and a program inside that folder.
    folder = tmp_path / "ppkit" / ".venv" / "bin"
    folder.mkdir(parents=True)
    (folder / "python").symlink_to(sys.executable)
    server = folder / "some-server"
    server.write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.Popen([str(folder / "python"), str(server), "--root", str(tmp_path / "ppkit")])
    try:
        deadline = time.monotonic() + 10
        while str(server) not in psutil.Process(proc.pid).cmdline():  # until it has exec'd its program
            assert time.monotonic() < deadline, psutil.Process(proc.pid).cmdline()
            time.sleep(0.02)
        assert proc.pid not in {p.pid for p in ppkit_children()}
    finally:
        proc.kill()
        proc.wait()


def test_every_process_of_a_cluster_is_found(cluster2):
    found = {p.pid for p in ppkit_children()}
    started = {p.pid for p in cluster2.processes()}
    assert len(started) == 3 and started <= found  # the fork server and its two forked workers


def test_a_leftover_is_reported_and_then_killed():
    env = {**os.environ, LAUNCHED_BY_ENV: str(os.getpid())}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert proc.pid in {p.pid for p in ppkit_children()}
        left = end_leftovers([proc.pid], timeout=0.2)
        assert len(left) == 1 and left[0].startswith(f"{proc.pid} (") and "time.sleep(60)" in left[0]
        assert proc.wait(timeout=5) == -9
        assert not wait_gone([proc.pid], timeout=0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
