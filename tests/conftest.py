"""Shared fixtures: a small real cluster, and a check that no ppkit process outlives a test."""

from __future__ import annotations

import os
import time

import psutil
import pytest

import ppkit


def ppkit_children() -> list[psutil.Process]:
    """Processes started by this test run that are ppkit workers or fork servers."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.pid != me and "ppkit" in cmd and env.get("PPKIT_TEST_OWNER") == str(me):
            found.append(proc)
    return found


@pytest.fixture(autouse=True, scope="session")
def _mark_owner():
    # children inherit this, so leftovers from *this* run can be told from other runs' processes
    os.environ["PPKIT_TEST_OWNER"] = str(os.getpid())
    yield


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        time.sleep(0.05)
    return alive


@pytest.fixture
def no_leftovers():
    """Fail the test if it leaves a ppkit worker or fork server running."""
    yield
    left = wait_gone([p.pid for p in ppkit_children()], timeout=5.0)
    assert not left, f"leftover ppkit processes: {left}"


@pytest.fixture(scope="module")
def cluster2():
    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster4():
    with ppkit.Cluster(4, "gloo", timeout=30) as cluster:
        yield cluster


@pytest.fixture
def fresh(cluster2):
    """The module's 2-rank cluster, restarted if a previous test broke it."""
    if cluster2.state == "broken":
        cluster2.restart()
    return cluster2
