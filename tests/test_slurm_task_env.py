"""Every rank of launcher="slurm" sees the SLURM variables `srun -n N` gives the task of that SLURM_PROCID in the
same job, on the node it really runs on, for layouts SLURM makes uneven (3 ranks on 2 nodes: "2,1" and "1,2").
Against the real SLURM of tests/slurm_testbed.py: srun itself, in the same job, says what each task should see."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from leftovers import slurm_job_id

import ppkit

pytestmark = pytest.mark.slurm

# what srun sets per task and per step; ids of the step itself (SLURM_STEP_ID, SLURM_TASK_PID, ports) differ
COMPARED = ("SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "SLURMD_NODENAME", "SLURM_GTIDS", "SLURM_NTASKS",
            "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_NODELIST",
            "SLURM_STEP_NODELIST", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_CPUS_ON_NODE",
            "SLURM_TOPOLOGY_ADDR", "SLURM_DISTRIBUTION", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "HOSTNAME")
SRUN_ENV = "env; echo HOSTNAME=$(hostname)"  # each task's variables and the host it runs on


def parse_srun(text: str) -> list[dict[str, str]]:
    """``srun -l``'s lines ("2: SLURM_NODEID=1") as each task's variables, by SLURM_PROCID."""
    tasks: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        label, _, pair = line.partition(": ")
        key, _, value = pair.partition("=")
        if label.strip().isdigit() and key in COMPARED:
            tasks.setdefault(int(label), {})[key] = value
    return [tasks[task] for task in sorted(tasks)]


def what_a_rank_sees(rank, world_size):
    import os
    import socket

    return {**{key: os.environ.get(key) for key in COMPARED}, "HOSTNAME": socket.gethostname()}


def assert_as_srun(ranks: list[dict], srun: list[dict], tasks_per_node: str) -> None:
    assert len(srun) == len(ranks) == 3, (srun, ranks)
    assert {task["SLURM_STEP_TASKS_PER_NODE"] for task in srun} == {tasks_per_node}, srun  # the layout meant
    for rank, (mine, theirs) in enumerate(zip(ranks, srun)):
        differ = {key: (mine.get(key), theirs.get(key)) for key in COMPARED if mine.get(key) != theirs.get(key)}
        assert not differ, f"rank {rank}: (ppkit's, srun's) {differ}"
    assert [r["SLURMD_NODENAME"] for r in ranks] == [f"n{1 + int(r['SLURM_NODEID'])}" for r in ranks]


def srun_in(job: str) -> list[dict[str, str]]:
    proc = subprocess.run(["srun", f"--jobid={job}", "--overlap", "-n", "3", "-l", "sh", "-c", SRUN_ENV],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return parse_srun(proc.stdout)


def test_a_batch_jobs_ranks_see_what_srun_gives_each_task_in_that_job_as_its_layout_changes(slurm_clean):
    # n1 with 1 CPU free: the job's 3 tasks are "1,2" (ppkit's guess before it runs is "2,1"); after the
    # restart, with n1 free again, "2,1": each node's agent says its ranks in whichever order they join
    blocker = slurm_clean.run(["sbatch", "--parsable", "-w", "n1", "-n", "3", "-o", "/dev/null", "--wrap", "sleep 300"],
                              check=True).stdout.strip().split(";")[0]
    try:
        with ppkit.Cluster(3, launcher="slurm", nodes=2) as cluster:
            assert_as_srun(cluster.run(what_a_rank_sees), srun_in(slurm_job_id(cluster)), "1,2")
            slurm_clean.run(["scancel", blocker], check=True)
            cluster.restart()
            assert_as_srun(cluster.run(what_a_rank_sees), srun_in(slurm_job_id(cluster)), "2,1")
    finally:
        slurm_clean.run(["scancel", blocker])


ALLOCATED = textwrap.dedent("""
    import json, os, socket, subprocess, sys, ppkit
    from test_slurm_task_env import SRUN_ENV, what_a_rank_sees
    srun = subprocess.run(["srun", "--overlap", "-n", "3", "-l", "sh", "-c", SRUN_ENV], capture_output=True,
                          text=True, timeout=60)
    print("SRUN", json.dumps(srun.stdout), flush=True)
    with ppkit.Cluster(3, launcher="slurm") as cluster:
        print("RANKS", json.dumps(cluster.run(what_a_rank_sees)), flush=True)
""")


def test_inside_an_allocation_the_ranks_see_what_srun_n3_gives_each_task_there(slurm_clean):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    proc = slurm_clean.run(["salloc", "-N", "2", "-n", "3", sys.executable, "-c", ALLOCATED], env=env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
            if line.startswith(("SRUN ", "RANKS "))}
    assert_as_srun(said["RANKS"], parse_srun(said["SRUN"]), "2,1")
    assert {rank["HOSTNAME"] for rank in said["RANKS"]} == {socket.gethostname()}  # the testbed's nodes: this machine
