"""The SLURM test cluster itself (tests/slurm_testbed.py): what the SLURM launcher's tests rely on."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest
import slurm_procs
import slurm_session
from slurm_testbed import NODES, SlurmMissing, SlurmTestbed, SlurmTestbedError


def sbatch(tb, *args: str) -> str:
    return tb.run(["sbatch", "--parsable", *args], check=True).stdout.strip().split(";")[0]


def wait_running(tb, job_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(j["job_id"] == job_id and j["state"] == "RUNNING" for j in tb.squeue()):
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not RUNNING after {timeout:g} s: {tb.squeue()}")


def processes_mentioning(text: str) -> list[str]:
    """Like `ps axe | grep text` (procps may be missing): live processes whose command line or environment has it."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if text in cmdline or any(text in value for value in slurm_procs.environ(proc.pid).values()):
            found.append(f"{proc.pid} {cmdline}")
    return found


def test_sinfo_shows_both_nodes_idle_in_partition_debug(slurm):
    # The testbed is shared by the session's SLURM tests: a job another test left pending or ending shows its
    # nodes as "plnd" (the backfill scheduler's plan) until it is gone (a fresh-clone run saw that once). This
    # test is about the testbed at rest, so it waits for an empty queue first and says which jobs it waited for.
    queued = slurm.squeue()
    slurm.wait_no_jobs(timeout=60)
    expected = {("n1", "debug*", "idle"), ("n2", "debug*", "idle"), ("n1", "one", "idle")}
    deadline = time.monotonic() + 20
    while True:
        out = slurm.run(["sinfo", "-h", "-N", "-o", "%N %P %t"], check=True).stdout.split("\n")
        rows = {tuple(line.split()) for line in out if line.strip()}
        if rows == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert rows == expected, f"{rows}; jobs queued when the test began: {queued}"
    assert os.environ["SLURM_CONF"] == str(slurm.conf_path)  # the fixture exported it for the code under test
    assert slurm_session.testbed() is slurm  # one per session: the notebooks' hook (../conftest.py) gets this one


def test_srun_spreads_four_ranks_over_two_nodes(slurm_clean):
    out = slurm_clean.run(["srun", "-l", "-N", "2", "-n", "4", "env"], check=True, timeout=60).stdout
    envs: dict[int, dict[str, str]] = {}
    for line in out.splitlines():
        label, _, var = line.partition(": ")
        key, _, value = var.partition("=")
        envs.setdefault(int(label), {})[key] = value
    assert sorted(envs) == [0, 1, 2, 3]
    assert [envs[r]["SLURM_PROCID"] for r in range(4)] == ["0", "1", "2", "3"]
    assert {envs[r]["SLURMD_NODENAME"] for r in range(4)} == {"n1", "n2"}
    assert {envs[r]["SLURM_NODELIST"] for r in range(4)} == {"n[1-2]"}
    assert {envs[r]["SLURM_NTASKS"] for r in range(4)} == {"4"}


@pytest.mark.slow
def test_sbatch_wrap_runs_to_completion(slurm_clean, tmp_path):
    out = tmp_path / "job.out"
    job = sbatch(slurm_clean, "-N", "2", "-n", "4", "-o", str(out),
                 "--wrap", "srun hostname > /dev/null && echo hello from $SLURM_JOB_ID on $SLURM_JOB_NODELIST")
    slurm_clean.wait_no_jobs(timeout=30)
    assert out.read_text().strip() == f"hello from {job} on n[1-2]"
    state = slurm_clean.run(["scontrol", "show", "job", job], check=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state


def test_scancel_removes_a_running_job(slurm_clean):
    job = sbatch(slurm_clean, "-o", "/dev/null", "--wrap", "sleep 300")
    wait_running(slurm_clean, job)
    slurm_clean.run(["scancel", job], check=True)
    slurm_clean.wait_no_jobs(timeout=20)


def test_partition_limits_leave_a_job_pending_with_the_reason(slurm_clean):
    # EnforcePartLimits stays at slurm's default (NO): sbatch accepts, the job waits and says why
    too_long = sbatch(slurm_clean, "-t", "2:00:00", "-o", "/dev/null", "--wrap", "true")
    too_many = sbatch(slurm_clean, "-p", "one", "-N", "2", "-o", "/dev/null", "--wrap", "true")
    # the first reason shown can be a passing one (None, PartitionConfig) until the scheduler has looked
    want = {too_long: ("PENDING", "PartitionTimeLimit"), too_many: ("PENDING", "PartitionNodeLimit")}
    deadline = time.monotonic() + 15
    while True:
        seen = {j["job_id"]: (j["state"], j["reason"]) for j in slurm_clean.squeue()}
        if seen == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    slurm_clean.run(["scancel", too_long, too_many], check=True)
    assert seen == want


def test_node_names_expand_and_nodes_are_reached_by_address(slurm):
    hosts = slurm.run(["scontrol", "show", "hostnames", "n[1-2]"], check=True).stdout.split()
    assert hosts == ["n1", "n2"]
    node = slurm.run(["scontrol", "show", "node", "n1"], check=True).stdout
    assert "NodeAddr=127.0.0.1" in node and "CPUTot=4" in node


@pytest.mark.slow
def test_killed_slurmd_goes_down_comes_back_and_stop_leaves_nothing():
    try:
        tb = SlurmTestbed()
    except SlurmMissing as exc:
        (pytest.fail if slurm_session.in_ci() else pytest.skip)(slurm_session.missing_message(exc))
    with tb:
        assert tb.env["SLURM_CONF"] != os.environ.get("SLURM_CONF")  # its own cluster, not the session's
        tb.kill_slurmd("n2")
        state = tb.wait_node_down("n2", timeout=40)
        assert "NOT_RESPONDING" in state or "DOWN" in state
        assert tb.node_state("n1") == "IDLE"
        tb.start_slurmd("n2", timeout=30)  # ReturnToService=2: back as soon as it registers
        assert tb.node_state("n2") == "IDLE"
        assert tb.run(["srun", "-N", "2", "-n", "4", "true"], timeout=60).returncode == 0
        job = sbatch(tb, "-N", "2", "-n", "4", "-o", "/dev/null", "--wrap", "srun sleep 300")
        wait_running(tb, job)
        deadline = time.monotonic() + 15
        while True:  # the batch script's srun starts the steps, then their tasks, a moment after the job is RUNNING
            started = tb._cluster_processes()
            steps = [p.pid for p in started if p.name() == "slurmstepd"]
            sleeps = [p.pid for p in started if p.name() == "sleep"]
            if (len(steps) == 3 and len(sleeps) == 4) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(steps) == 3, f"a batch step on n1 and a step on each node: {started}"
        assert sum(p.name() == "sleep" for p in started) == 4, started
        tmpdir = str(tb.tmpdir)
        seen = " ".join(processes_mentioning(tmpdir))  # the check below finds what it should
        for name in ("munged", "slurmctld", "slurmd", "slurmstepd", "sleep 300"):
            assert name in seen, seen
    # the daemons (by their paths), slurmstepd (by the marker in their environment), the job's tasks (SLURM_CONF)
    assert processes_mentioning(tmpdir) == []
    assert [p for p in started if slurm_procs.alive(p)] == []  # the slurmstepd, batch script, srun and sleeps seen
    assert not os.path.exists(tmpdir)
    tb.stop()  # idempotent


def test_a_failed_start_says_why_and_leaves_nothing(monkeypatch):
    try:
        tb = SlurmTestbed()
    except SlurmMissing as exc:
        (pytest.fail if slurm_session.in_ci() else pytest.skip)(slurm_session.missing_message(exc))
    monkeypatch.setattr(tb, "_slurm_conf", lambda: "ClusterName=broken\nNoSuchOption=1\n")
    with pytest.raises(SlurmTestbedError, match="slurmctld exited") as info:
        tb.start(timeout=20)
    assert "NoSuchOption" in str(info.value)  # the log tail says what slurmctld disliked
    assert processes_mentioning(str(tb.tmpdir)) == []
    tb.stop()


def test_missing_binaries_are_named_with_the_fix(monkeypatch):
    import slurm_testbed

    real_which = slurm_testbed.shutil.which
    monkeypatch.setattr(slurm_testbed.shutil, "which",
                        lambda name, path=None: None if name in ("sbatch", "munged") else real_which(name, path=path))
    with pytest.raises(SlurmMissing, match=r"munged, sbatch not found; install them with `make slurm`"):
        slurm_testbed.find_binaries()


def test_restore_nodes_brings_back_a_killed_node(slurm_restore_nodes):
    slurm_restore_nodes.kill_slurmd("n1")
    assert not slurm_restore_nodes.slurmd_running("n1")
    slurm_restore_nodes.restore_nodes()
    assert [slurm_restore_nodes.node_state(n) for n in NODES] == ["IDLE", "IDLE"]


@pytest.mark.parametrize("source, uses", [
    ('ppkit.Cluster(4, launcher="slurm")', True),
    ("Cluster(2, launcher = 'slurm')", True),
    ("!sinfo -N", True),
    ('ppkit.Cluster(4, launcher="ssh")  # not slurm', False),
])
def test_notebooks_that_need_the_cluster_are_recognised(tmp_path, source, uses):
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [source]}]}))  # quotes escaped in JSON
    assert slurm_session.notebook_uses_slurm(path) is uses
