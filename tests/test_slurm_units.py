"""The SLURM launcher's pieces that need no SLURM: options, the scripts' text, squeue's words."""

from __future__ import annotations

import pytest

import ppkit
from ppkit.cluster.slurm import commands, layout, script
from ppkit.cluster.slurm.options import SlurmOptions, allocation_nodes, check_slurm_options
from ppkit.cluster.slurm.watch import JobUpdate, describe
from ppkit.cluster.spec import cluster_spec


@pytest.mark.parametrize("time", ["45", "30:00", "00:30:00", "1-0", "1-12:00", "2-00:00:00"])
def test_slurm_time_formats_are_accepted(time):
    assert check_slurm_options(time=time, need_tools=False).time == time


@pytest.mark.parametrize("options, said", [
    ({"nodes": 0}, "nodes must be a whole number"), ({"nodes": True}, "nodes must be"),
    ({"nodes": 1.5}, "nodes must be"), ({"time": "1h"}, "time must be a SLURM time limit"),
    ({"time": 30}, "time must be"), ({"partition": "a b"}, "partition must be"),
    ({"sbatch_args": "--qos=x"}, "sbatch_args must be a list"), ({"sbatch_args": ["-N", "3"]}, "set what ppkit sets"),
    ({"sbatch_args": ["--time=5"]}, "set what ppkit sets"),
])
def test_bad_slurm_options_say_which_and_what_works(options, said):
    with pytest.raises(ppkit.ConfigError, match=said):
        check_slurm_options(**options, need_tools=False)


def test_the_launcher_is_chosen_by_name_and_the_old_spellings_still_work(monkeypatch):
    monkeypatch.delenv("PPKIT_START_METHOD", raising=False)
    assert cluster_spec(2).launcher == "local"
    assert cluster_spec(2, start_method="spawn").launcher == "spawn"
    assert cluster_spec(2, launcher="spawn").launcher == "spawn"
    assert cluster_spec(2, listen="127.0.0.1:0").launcher == "remote"
    assert cluster_spec(2, listen="127.0.0.1:0").remote == ("worker1",)
    with pytest.raises(ppkit.ConfigError, match="contradict"):
        cluster_spec(2, launcher="local", start_method="spawn")
    with pytest.raises(ppkit.ConfigError, match="unknown launcher 'sge'"):
        cluster_spec(2, launcher="sge")
    with pytest.raises(ppkit.ConfigError, match="pass listen="):
        cluster_spec(2, launcher="remote")
    with pytest.raises(ppkit.ConfigError, match="only apply to launcher='slurm'"):
        cluster_spec(2, partition="debug")


def test_the_spec_is_frozen():
    spec = cluster_spec(2)
    with pytest.raises(AttributeError):
        spec.world_size = 3


def test_the_batch_script_holds_every_option_and_no_key():
    options = SlurmOptions(nodes=2, partition="debug", time="00:10:00", sbatch_args=("--account=course",))
    command = script.worker_command("10.0.0.1:4000", 120, python="/opt/py/bin/python")
    text = script.batch_script(options, 4, command, "/home/u/.cache/ppkit/slurm/ppkit-%j.out")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks=4", "#SBATCH --time=00:10:00", "#SBATCH --partition=debug",
                 "#SBATCH --account=course", "#SBATCH --output=/home/u/.cache/ppkit/slurm/ppkit-%j.out",
                 'export PPKIT_TASKS_PER_NODE="$SLURM_TASKS_PER_NODE"',
                 "srun --whole --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 /opt/py/bin/python -m "
                 "ppkit worker --connect 10.0.0.1:4000 --name 'node{rank}' --timeout 120"):
        assert line in text
    assert "PPKIT_KEY=" not in text


def test_inside_an_allocation_a_step_overlaps_the_notebooks():
    command = script.srun_command(SlurmOptions(nodes=2), 4, "77", ["python", "-m", "ppkit", "worker"])
    assert command[:8] == ["srun", "--overlap", "--whole", "--jobid=77", "--nodes=2", "--ntasks=2",
                           "--ntasks-per-node=1", "--kill-on-bad-exit=1"]


@pytest.mark.parametrize("world_size, cpus, spread", [
    (4, [3, 1], "3,1"), (3, [3, 1], "2,1"), (4, [4, 4], "2,2"), (4, [1, 1], "2,2"), (1, [4, 4], "1"),
    (5, [1, 1, 1], "2,2,1"),
])
def test_inside_an_allocation_ranks_are_dealt_as_srun_deals_tasks_over_the_cpus(world_size, cpus, spread):
    assert layout.like_srun(world_size, cpus) == spread


def test_inside_an_allocation_nodes_default_to_all_of_it_and_more_are_refused_with_both_numbers():
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_NUM_NODES": "3"}
    assert allocation_nodes(None, 8, env) == 3 and allocation_nodes(None, 2, env) == 2
    assert allocation_nodes(2, 8, env) == 2 and allocation_nodes(None, 8, {}) is None
    with pytest.raises(ppkit.ConfigError, match=r"nodes=4 is more than the 3 node\(s\) of your allocation 12.*salloc"):
        allocation_nodes(4, 8, env)


def test_the_training_script_is_seed002s_pattern():
    text = script.training_script(["train.py", "--epochs", "3"], SlurmOptions(nodes=2), 8, 29511, python="python")
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --job-name=train" in text
    assert 'export MASTER_ADDR=$(python -m ppkit.cluster.slurm.hosts "$SLURM_JOB_NODELIST")' in text
    assert "export MASTER_PORT=29511" in text and text.rstrip().endswith("srun python train.py --epochs 3")


def test_squeue_reasons_that_waiting_cannot_cure_are_told_apart():
    assert commands.JobStatus("1", "PENDING", "PartitionTimeLimit", "").hopeless
    assert not commands.JobStatus("1", "PENDING", "Resources", "").hopeless
    assert not commands.JobStatus("1", "RUNNING", "None", "n1").hopeless
    assert commands.JobStatus("1", "NODE_FAIL", "None", "n[1-2]").ended


def test_the_pending_line_says_state_reason_and_wait():
    assert describe(JobUpdate("9", commands.JobStatus("9", "PENDING", "Priority", ""), 12.4)) == \
        "SLURM job 9: PENDING (Priority), waited 12 s (squeue -j 9)"
    assert describe(JobUpdate("9", commands.JobStatus("9", "RUNNING", "None", "n[1-2]"), 1.25)) == \
        "SLURM job 9: RUNNING on n[1-2], 1.2 s after it was submitted"
    assert "no longer known" in describe(JobUpdate("9", None, 3))


def test_worker_names_can_carry_the_launchers_rank():
    from types import SimpleNamespace

    from ppkit.cli.worker import resolve

    args = SimpleNamespace(connect="127.0.0.1:4000", name="task{rank}", port=29600, key="ab" * 32, timeout=5.0)
    _, name, _ = resolve(args, {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
                                "SLURM_NODELIST": "n[1-2]"})
    assert name == "task3"


def test_a_nodes_ranks_follow_slurms_tasks_per_node():
    from ppkit.cluster.slurm import layout

    assert layout.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert layout.node_ranks("3,1", 0) == [0, 1, 2] and layout.node_ranks("3,1", 1) == [3]
    assert layout.node_ranks("2(x2)", 1) == [2, 3]
    assert layout.even(5, 2) == "3,2" and layout.even(4, 4) == "1,1,1,1"
    with pytest.raises(ppkit.ConfigError, match="SLURM_TASKS_PER_NODE's form"):
        layout.tasks_per_node("three")
    with pytest.raises(ppkit.ConfigError, match="not one of the 2 node"):
        layout.node_ranks("3,1", 2)


@pytest.mark.parametrize("tasks, expected", [
    ("2,1", [("0", "0", "0,1"), ("0", "1", "0,1"), ("1", "0", "2")]),
    ("1,2", [("0", "0", "0"), ("1", "0", "1,2"), ("1", "1", "1,2")]),
    ("2(x2),1", [("0", "0", "0,1"), ("0", "1", "0,1"), ("1", "0", "2,3"), ("1", "1", "2,3"), ("2", "0", "4")]),
])
def test_each_rank_gets_what_srun_gives_its_task_on_an_uneven_layout(tasks, expected):
    counts = layout.tasks_per_node(tasks)
    for rank, (node, local, gtids) in enumerate(expected):
        env = layout.task_env(counts, rank)
        assert (env["SLURM_NODEID"], env["SLURM_LOCALID"], env["SLURM_GTIDS"]) == (node, local, gtids), (rank, env)
        assert rank in layout.node_ranks(tasks, int(node))  # the node whose agent forks it
        assert env["SLURM_PROCID"] == str(rank) and env["SLURM_DISTRIBUTION"] == "block"
        assert env["SLURM_TASKS_PER_NODE"] == env["SLURM_STEP_TASKS_PER_NODE"] == tasks  # SLURM's compressed form
        assert env["SLURM_NTASKS"] == env["SLURM_NPROCS"] == env["SLURM_STEP_NUM_TASKS"] == str(len(expected))
        assert env["SLURM_NNODES"] == env["SLURM_STEP_NUM_NODES"] == str(len(counts))
    with pytest.raises(ppkit.ConfigError, match=r"rank 3 has no place in a layout of \[2, 1\]"):
        layout.task_env([2, 1], 3)


def test_tasks_per_node_is_written_as_slurm_writes_it():
    assert layout.compressed([2, 2, 1]) == "2(x2),1" and layout.compressed([2, 1]) == "2,1"
    assert layout.compressed([1, 1]) == "1(x2)" and layout.compressed([3, 1, 1, 3]) == "3,1(x2),3"
    assert layout.tasks_per_node(layout.compressed([4, 4, 2, 4])) == [4, 4, 2, 4]


@pytest.mark.parametrize("guess, said, placed", [
    # node0 joins first and says (0, 1) where the guess was "1,2": rank 1 is node0's alone (it was node1's too,
    # and rank 1 was told SLURM_NODEID 1 while it ran on node 0)
    ([(0,), (1, 2)], {0: (0, 1)}, [(0, 1), (2,)]),
    ([(0, 1), (2, 3)], {0: (0, 1, 2)}, [(0, 1, 2), (3,)]),  # "3,1" where "2,2" was guessed
    ([(0, 1), (2,)], {1: (1, 2)}, [(0,), (1, 2)]),
    ([(0, 1), (2, 3), (4, 5)], {1: (1, 2, 3, 4)}, [(0,), (1, 2, 3, 4), (5,)]),
    ([(0, 1), (2, 3), (4, 5)], {0: (0, 1, 2), 2: (4, 5)}, [(0, 1, 2), (3,), (4, 5)]),
    ([(0, 1), (2, 3)], {0: (0,), 1: (1, 2, 3)}, [(0,), (1, 2, 3)]),
    ([(0, 1), (2, 3), (4, 5)], {0: (0, 1, 2), 2: (3, 4, 5)}, [(0, 1), (2, 3), (4, 5)]),  # no task left for node1
])
def test_what_a_nodes_agent_says_stands_and_every_rank_has_one_node(guess, said, placed):
    assert layout.settle(sum(map(len, guess)), guess, said) == placed
