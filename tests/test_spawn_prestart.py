"""``%load_ext ppkit`` starts ppkit.spawn's 2-process fork server in the background: the cell returns at
once and prints nothing, the first ``%%torchrun`` uses that fork server, and nothing of it outlives the
kernel, ``ppkit.spawn``'s close (even while it is still starting) or a ``PPKIT_PRESTART=0`` opt-out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from leftovers import ppkit_children, wait_gone

from ppkit.cluster.spawn import call as spawn_call

REPO = Path(__file__).resolve().parents[1]
KERNEL = """
import contextlib, io, json, os, sys, time
from IPython.core.interactiveshell import InteractiveShell
from ppkit.cluster.spawn import call
shell = InteractiveShell.instance()
out = io.StringIO()
start = time.perf_counter()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    ok = shell.run_cell("%load_ext ppkit", store_history=False).success
took = time.perf_counter() - start
for thread in [t for t in __import__("threading").enumerate() if t.name == "ppkit-spawn-prestart"]:
    thread.join(120 if sys.argv[1] == "wait" else 0)  # "now": the first run comes while it starts
cell = "%%torchrun --nproc-per-node 2\\nimport os\\nprint(os.getppid())\\n"
with contextlib.redirect_stdout(io.StringIO()) as ranks:
    ran = shell.run_cell(cell, store_history=False).success
server = call._kept[(2, "auto")]._launcher.fork_server_pid
print(json.dumps({"ok": ok, "took": took, "printed": out.getvalue(), "server": server, "ran": ran,
                  "parents": sorted({int(line.split()[-1]) for line in ranks.getvalue().splitlines()})}))
"""  # exits without ppkit.spawn's close, as a kernel that is shut down


@pytest.mark.slow
@pytest.mark.parametrize("first_run", ["wait", "now"])
def test_load_ext_starts_the_fork_server_quietly_the_first_run_uses_it_and_the_kernels_exit_stops_it(first_run):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PPKIT_PRESTART", None)
    done = subprocess.run([sys.executable, "-c", KERNEL, first_run], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.splitlines()[-1])
    assert facts["ok"] and facts["ran"]
    assert facts["took"] < 0.5, "the %load_ext cell waited for the fork server"
    assert facts["printed"] == ""
    assert facts["parents"] == [facts["server"]]  # the first run's ranks were forked by the prestarted server
    assert wait_gone([facts["server"]], timeout=5.0) == []


@pytest.mark.slow
def test_close_while_the_fork_server_is_still_starting_leaves_nothing(no_leftovers):
    spawn_call.close()
    thread = spawn_call.prestart()
    assert thread is not None
    spawn_call.close()  # waits for the start, then stops it
    thread.join(60)
    assert spawn_call._kept == {}
    assert wait_gone([p.pid for p in ppkit_children()], timeout=5.0) == []


def test_ppkit_prestart_0_starts_nothing(monkeypatch, no_leftovers):
    monkeypatch.setenv("PPKIT_PRESTART", "0")
    assert spawn_call.prestart() is None
