"""``ppkit preflight``: the real run end to end, and each way a check can go wrong."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
from leftovers import end_leftovers, ppkit_children

from ppkit import machine, preflight
from ppkit.preflight import Preflight

SUMMARY = re.compile(r"^ppkit preflight: (\d+)/(\d+) ok(, \d+ warnings?)? \(python \d+\.\d+\.\d+, "
                     r"torch \d+\.\d+\.\d+, (linux|macos|win32), [\d.]+ cores\)$")
NAMES = ["python", "torch", "torchvision", "backends", "widgets", "machine", "memory", "ports", "cluster",
         "rpc world", "pipeline"]


@pytest.mark.slow
def test_cli_runs_every_check_and_ends_with_one_summary_line():
    done = subprocess.run([sys.executable, "-m", "ppkit", "preflight"], capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    checks = [line for line in lines if re.match(r"^(ok|warn|FAIL|skip) ", line)]
    assert [line[6:20].strip() for line in checks] == NAMES
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    assert match.group(1) == match.group(2) == str(len(NAMES))
    assert "pipeline" in checks[-1] and "equal to the local model" in checks[-1]
    assert not end_leftovers([p.pid for p in ppkit_children()], timeout=5.0)


def _quiet(**replaced) -> Preflight:
    """A Preflight whose named checks are replaced (by default the runtime ones, which start processes, and
    memory, whose verdict depends on this machine's limit: tests/test_memory.py tests it)."""
    checker = Preflight(emit=lambda line: None)
    for name in ("memory", "cluster", "rpc_world", "pipeline"):
        replaced.setdefault(name, lambda name=name: preflight.Check(name.replace("_", " "), "ok", "stand-in"))
    for name, fn in replaced.items():
        fn.__name__ = name
        setattr(checker, name, fn)
    return checker


def test_untested_version_warns_with_the_fix(monkeypatch):
    monkeypatch.setitem(preflight.TESTED, "torch", ("1.13",))
    checker = _quiet()
    checks = {c.name: c for c in checker.run()}
    assert checks["torch"].status == "warn"
    assert "not a tested version (tested: 1.13)" in checks["torch"].detail
    assert "constraints.txt" in checks["torch"].fix
    assert checker.ok  # a warning is not a failure
    assert "1 warning" in checker.summary()


def test_a_failed_check_skips_what_needs_it_and_fails_the_summary():
    def torch():
        raise ImportError("No module named 'torch'")

    lines = []
    checker = _quiet(torch=torch)
    checker.emit = lines.append
    checks = {c.name: c for c in checker.run()}
    assert checks["torch"].status == "FAIL"
    assert "ImportError: No module named 'torch'" in checks["torch"].detail
    assert "constraints.txt" in checks["torch"].fix
    for name in ("torchvision", "backends", "cluster", "rpc world", "pipeline"):
        assert checks[name].status == "skip", name
        assert "failed above" in checks[name].detail
    assert not checker.ok
    assert "fix: " in "\n".join(lines)
    assert re.search(r"ppkit preflight: 5/11 ok, 6 not ok \(", lines[-1]), lines[-1]


def test_missing_widget_frontend_fails_with_the_fix(monkeypatch):
    monkeypatch.setattr(machine, "widget_frontend", lambda: None)
    checks = {c.name: c for c in _quiet().run()}
    assert checks["widgets"].status == "FAIL"
    assert "jupyterlab-manager" in checks["widgets"].detail
    assert "pip install jupyterlab_widgets" in checks["widgets"].fix


def test_busy_ppkit_port_is_a_warning():
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", preflight.PPKIT_PORT))
        except OSError:
            pytest.skip(f"port {preflight.PPKIT_PORT} is already in use on this machine")
        sock.listen(1)
        check = _quiet().ports()
    assert check.status == "warn" and str(preflight.PPKIT_PORT) in check.detail


def test_one_core_is_a_warning(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    check = _quiet().machine()
    assert check.status == "warn" and "share one core" in check.detail


def test_notebook_runner_stops_a_run_that_takes_too_long(capsys):
    status = preflight.run_in_subprocess(timeout=0.3)
    assert status != 0
    assert "did not finish within 0.3 s" in capsys.readouterr().out
    assert not end_leftovers([p.pid for p in ppkit_children()], timeout=5.0)
