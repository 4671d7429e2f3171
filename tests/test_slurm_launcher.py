"""launcher="slurm" against a real SLURM: munged, slurmctld and two slurmd (n1, n2) started by the
`slurm` fixture (tests/slurm_testbed.py). Nothing is mocked: every job is submitted with sbatch,
every cancel is scancel, and squeue is asked whether anything is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from leftovers import end_leftovers, ppkit_children, slurm_job_id

import ppkit

pytestmark = pytest.mark.slurm


def queue(slurm) -> str:
    return slurm.run(["squeue", "-h", "-o", "%i %T %r"]).stdout.strip()


def wait_queue_empty(slurm, timeout: float = 20.0) -> float:
    """Seconds until squeue shows no job; fails the test after ``timeout``."""
    start = time.monotonic()
    while queue(slurm):
        assert time.monotonic() - start < timeout, f"still queued after {timeout} s:\n{queue(slurm)}"
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.fixture
def clean(slurm):
    yield slurm
    wait_queue_empty(slurm)
    left = end_leftovers([p.pid for p in ppkit_children()], timeout=10.0)
    assert not left, f"leftover ppkit processes (now killed): {left}"


def test_start_run_ranks_and_close_leave_nothing_queued(clean, capsys):
    cluster = ppkit.start(4, launcher="slurm", nodes=2)
    try:
        out = capsys.readouterr().out
        assert "SLURM job" in out and "RUNNING on n[1-2]" in out
        procs = cluster.run(lambda rank, world_size: (os.environ["SLURM_PROCID"], os.environ["SLURMD_NODENAME"]))
        assert [int(p) for p, _ in procs] == [0, 1, 2, 3]  # rank = SLURM_PROCID
        assert {node for _, node in procs} == {"n1", "n2"}
        assert cluster.run(lambda rank, world_size: os.environ["MASTER_ADDR"]) == ["127.0.0.1"] * 4  # n1's NodeAddr
        assert "#SBATCH --nodes=2" in cluster.slurm_script and "#SBATCH --ntasks=4" in cluster.slurm_script
        assert "srun --whole" in cluster.slurm_script
        assert cluster._key.hex() not in cluster.slurm_script  # the key travels in the environment only
        assert "launcher='slurm job" in repr(cluster)
        assert [p.role for p in cluster.processes()].count("worker") == 4
        from ppkit.cluster.session import ranks

        ranks("", "t = torch.ones(1) * rank\ndist.all_reduce(t)\nprint('sum', int(t))")
        assert capsys.readouterr().out.count("sum 6") == 4
        job = slurm_job_id(cluster)
        assert job in queue(clean)
    finally:
        cluster.close()
    assert wait_queue_empty(clean) < 20


def test_restart_cancels_the_job_and_submits_another(clean):
    with ppkit.Cluster(2, launcher="slurm", nodes=2) as cluster:
        first = slurm_job_id(cluster)
        cluster.restart()
        second = slurm_job_id(cluster)
        assert second != first
        assert cluster.run(lambda rank, world_size: rank) == [0, 1]
        listed = queue(clean)
        assert first not in [line.split()[0] for line in listed.splitlines()] and second in listed


def test_a_pending_job_is_shown_then_cancelled_at_start_timeout_with_squeues_reason(clean, capsys):
    start = time.monotonic()
    with pytest.raises(ppkit.LaunchError, match=r"(?s)still PENDING, squeue's reason: BeginTime.*cancelled"):
        ppkit.start(2, launcher="slurm", sbatch_args=["--begin=now+120"], start_timeout=5)
    assert time.monotonic() - start < 15
    assert "PENDING (BeginTime), waited" in capsys.readouterr().out


@pytest.mark.parametrize("options, said", [
    ({"partition": "nope"}, r"sbatch refused the job: .*[Ii]nvalid partition"),
    ({"partition": "one", "nodes": 2}, r"can never start: squeue's reason is PartitionNodeLimit"),
    ({"nodes": 3}, r"can never start: squeue's reason is PartitionNodeLimit|sbatch refused the job"),
    ({"time": "3:00:00"}, r"can never start: squeue's reason is PartitionTimeLimit"),
])
def test_bad_slurm_input_fails_in_seconds_with_slurms_own_words_and_nothing_queued(clean, options, said):
    start = time.monotonic()
    with pytest.raises(ppkit.LaunchError, match=said):
        ppkit.start(4, launcher="slurm", **options)
    assert time.monotonic() - start < 15


def test_bad_options_are_refused_before_anything_is_submitted(slurm):
    for options, said in [({"time": "half an hour"}, "time must be a SLURM time limit"),
                          ({"nodes": 0}, "nodes must be a whole number"),
                          ({"nodes": 5}, "more than the 4 rank"),
                          ({"sbatch_args": ["--nodes=3"]}, "set what ppkit sets"),
                          ({"remote": ["w1"]}, "SLURM starts every rank")]:
        with pytest.raises(ppkit.ConfigError, match=said):
            ppkit.start(4, launcher="slurm", **options)
    with pytest.raises(ppkit.ConfigError, match="only apply to launcher='slurm'"):
        ppkit.start(2, nodes=2)
    assert queue(slurm) == ""


def test_no_slurm_on_path_names_what_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ppkit.ConfigError, match=r"(?s)sbatch.*not on PATH.*apt-get install slurm-client"):
        ppkit.start(2, launcher="slurm")


KERNEL = textwrap.dedent("""
    import sys, time, ppkit
    extra = {"sbatch_args": ["--begin=now+120"], "start_timeout": 300} if sys.argv[1] == "pending" else {}
    cluster = ppkit.start(2, launcher="slurm", nodes=2, **extra)
    print("READY", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("when", ["running", "pending"])
def test_a_sigkilled_kernel_leaves_no_job(clean, when):
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, when], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while when in ("running",) and "READY" not in kernel.stdout.readline():
            assert time.monotonic() < deadline and kernel.poll() is None
        while when == "pending" and "PENDING" not in queue(clean):
            assert time.monotonic() < deadline and kernel.poll() is None
            time.sleep(0.2)
        assert queue(clean)
    finally:
        kernel.send_signal(signal.SIGKILL)
        kernel.wait()
    assert wait_queue_empty(clean) < 20


def test_a_node_lost_mid_job_is_reported_as_a_dying_rank(clean, slurm_restore_nodes):
    with ppkit.Cluster(2, launcher="slurm", nodes=2, timeout=120) as cluster:
        threading.Timer(2.0, clean.kill_slurmd, ("n2",)).start()  # the node dies with its tasks, mid-job
        try:
            lost = r"(?s)rank 1.*SLURM job \d+ is [A-Z_]+"
            with pytest.raises((ppkit.WorkerDiedError, ppkit.LaunchError), match=lost):
                cluster.run(lambda rank, world_size: time.sleep(100))
            with pytest.raises(ppkit.ClusterStateError):
                cluster.run(lambda rank, world_size: rank)
        finally:
            cluster.close()


ALLOCATED = textwrap.dedent("""
    import os, subprocess, time, ppkit
    job = os.environ["SLURM_JOB_ID"]
    def said(*args):
        return subprocess.run(args, capture_output=True, text=True, timeout=60).stdout.split()
    def steps():
        return said("squeue", "-h", "-s", "-j", job, "-o", "%i")
    before = steps()
    srun = sorted(said("srun", "--overlap", "-l", "-n4", "printenv", "SLURMD_NODENAME")[1::2])  # '0:' 'n1' ...
    print("SRUN", srun)
    cluster = ppkit.start(4, launcher="slurm")
    print("SCRIPT", cluster.slurm_script)
    print("RESULT", cluster.run(lambda rank, world_size: (os.environ["SLURM_JOB_ID"], os.environ["SLURM_PROCID"],
                                                         os.environ["SLURMD_NODENAME"])))
    print("QUEUE", said("squeue", "-h", "-o", "%i"))
    cluster.restart()
    print("AGAIN", cluster.run(lambda rank, world_size: rank))
    cluster.close()
    deadline = time.monotonic() + 15
    while steps() != before and time.monotonic() < deadline:
        time.sleep(0.2)
    print("STEPS", steps() == before, before, steps())
    try:
        ppkit.start(4, launcher="slurm", nodes=3)
    except ppkit.ConfigError as exc:
        print("REFUSED", exc)
""")


def test_inside_an_allocation_the_ranks_are_a_step_over_all_its_nodes_as_srun_spreads_them(clean):
    proc = clean.run(["salloc", "-N", "2", "-n", "4", sys.executable, "-c", ALLOCATED], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}
    job = lines["SCRIPT"].split("--jobid=")[1].split()[0]
    assert lines["SCRIPT"].startswith("srun --overlap --whole --jobid=") and "--nodes=2" in lines["SCRIPT"]
    assert f"SLURM job {job}: a step of your allocation {job} (2 nodes, 4 tasks)" in proc.stdout
    assert "submitted" not in proc.stdout
    placed = eval(lines["RESULT"])  # noqa: S307 - our own script's repr of a list of tuples
    assert [(j, p) for j, p, _ in placed] == [(job, str(rank)) for rank in range(4)]
    srun = eval(lines["SRUN"])  # noqa: S307 - srun -n4's own placement in this allocation, by rank
    assert [node for _, _, node in placed] == srun and set(srun) == {"n1", "n2"}, (placed, srun)
    assert lines["QUEUE"] == repr([job])  # no job of its own: a step of the allocation
    assert lines["AGAIN"] == "[0, 1, 2, 3]"
    assert lines["STEPS"].startswith("True"), lines["STEPS"]  # the allocation is left as it was
    assert lines["REFUSED"].startswith(f"nodes=3 is more than the 2 node(s) of your allocation {job}")


def test_the_rpc_pipeline_runs_and_verifies_on_two_nodes(clean):
    proc = subprocess.run([sys.executable, "-m", "ppkit", "pipeline", "--launcher", "slurm", "--nodes", "2", "--verify",
                           "--microbatch-sizes", "8", "16", "--num-batches", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RUNNING on n[1-2]" in proc.stdout
    assert ": OK (tolerance" in proc.stdout and "speed-up over no overlap" in proc.stdout


def test_seed002_runs_under_srun_on_two_nodes_with_read_launch_env(clean):
    from ppkit.lessons.seed002 import run_srun

    records = run_srun(nodes=2, ntasks=4)
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert {r["node"] for r in records} == {"n1", "n2"}
    assert all(r["world_size"] == 4 and r["same_weights_everywhere"] for r in records)
    assert {r["master_addr"] for r in records} == {"127.0.0.1"}  # n1 does not resolve: its NodeAddr


def test_slurm_script_writes_what_sbatch_runs(clean, tmp_path):
    path = tmp_path / "train.sbatch"
    proc = subprocess.run([sys.executable, "-m", "ppkit", "slurm-script", "--nodes", "2", "--ntasks-per-node", "2",
                           "--port", "29571", "-o", str(path), "--", "-m", "ppkit.lessons.seed002"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --ntasks-per-node=2" in path.read_text()
    submitted = clean.run(["sbatch", "--parsable", str(path)], cwd=tmp_path, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    ended = clean.wait_job(job)  # as `sbatch --wait`, sooner
    assert (ended["JobState"], ended["ExitCode"]) == ("COMPLETED", "0:0"), ended
    lines = (tmp_path / f"seed002-{job}.out").read_text().splitlines()
    assert sorted(line.split('"rank": ')[1].split(",")[0] for line in lines if line.startswith("{")) == list("0123")
