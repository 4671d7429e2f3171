"""%%torchrun --nnodes 2 and ppkit.torchrun(..., nnodes=2) on the real SLURM of tests/slurm_testbed.py
(nodes n1, n2): through IPython's shell as a notebook runs the cell, and inside an allocation (salloc).
Every run is a SLURM job (or step) of its own, ended when the run ends; squeue is asked each time."""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import threading
import time

import pytest
from leftovers import end_leftovers, ppkit_children

import ppkit
from ppkit.lessons.data_parallel import free_port

SCRIPT = """\
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")  # no rank arguments, as in a torchrun script
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
e = os.environ
print("FACTS", e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"],
      e["GROUP_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["SLURMD_NODENAME"], int(total.item()))
dist.destroy_process_group()
"""
FACTS = re.compile(r"^\[rank (\d)\] FACTS (.*)$", re.M)


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext ppkit", store_history=False)
    yield shell
    from ppkit.cluster.spawn import call as spawn_call

    spawn_call.close()  # the fork server %load_ext ppkit starts ahead


@pytest.fixture
def clean(slurm_clean):
    """The testbed; after the test, no job in its queue (slurm_clean) and no ppkit process left."""
    yield slurm_clean
    slurm_clean.wait_no_jobs(timeout=20)
    # the fork server %load_ext ppkit started ahead, this process's child, stays until the module ends
    left = end_leftovers([p.pid for p in ppkit_children() if "ppkit.transport.zygote" not in " ".join(p.cmdline())
                          or p.ppid() != os.getpid()], timeout=10.0)
    assert not left, f"leftover ppkit processes (now killed): {left}"


def facts(out: str) -> dict[int, list[str]]:
    found = {int(rank): line.split() for rank, line in FACTS.findall(out)}
    assert sorted(found) == [0, 1, 2, 3], out
    return found


def check_two_by_two(found: dict[int, list[str]], port: int | None = None) -> None:
    """torchrun --nnodes 2 --nproc-per-node 2: ranks 0-1 on one node, 2-3 on the other, all_reduce of 1+2+3+4.
    The runs keep each rank's line (--no-collapse): lines that differ only in their numbers would fold."""
    for rank, (rank_, local, group, world, local_world, group_world, _, master_port, _, total) in found.items():
        assert (int(rank_), int(local), int(group)) == (rank, rank % 2, rank // 2)
        assert (world, local_world, group_world, total) == ("4", "2", "2", "10")
        assert port is None or master_port == str(port)
    assert found[0][8] == found[1][8] != found[2][8] == found[3][8], found  # SLURMD_NODENAME
    assert {found[0][8], found[2][8]} == {"n1", "n2"}
    assert {f[6] for f in found.values()} == {"127.0.0.1"}  # MASTER_ADDR: n1's NodeAddr on the testbed


@pytest.mark.slurm
@pytest.mark.slow
def test_a_cell_runs_on_two_nodes_two_ranks_each_and_again_on_the_same_port(shell, clean, capsys):
    port = free_port()
    for _ in range(2):  # fresh processes every run: torchrun's fixed MASTER_PORT is free again
        magic = f"%%torchrun --no-collapse --nnodes 2 --nproc-per-node 2 --master-port {port}"
        result = shell.run_cell(f"{magic}\n{SCRIPT}", store_history=False)
        assert result.error_in_exec is None, result.error_in_exec
        out = capsys.readouterr().out
        assert re.search(r"SLURM job \d+: submitted \(2 nodes, 4 tasks\)", out)
        check_two_by_two(facts(out), port)
        clean.wait_no_jobs(timeout=20)  # the run's job ended with it


@pytest.mark.slurm
@pytest.mark.slow
def test_a_failing_rank_on_the_second_node_names_it_and_the_cells_line(shell, clean):
    result = shell.run_cell("%%torchrun --nnodes 2 --nproc-per-node 2\nimport os\nx = 1\n"
                            "if os.environ['RANK'] == '3':\n    raise ValueError('only on one')\n", store_history=False)
    err = result.error_in_exec
    assert isinstance(err, ppkit.ProcessRaisedError) and err.error_index == 3, err
    assert str(err).startswith("rank 3 of 4 (pid ") and "raised ValueError: only on one" in str(err)
    traceback = str(err).split("--- traceback in rank 3 ---\n")[1]
    assert traceback.startswith('Traceback (most recent call last):\n  File "<%%torchrun cell')
    assert "line 4, in <module>\n    raise ValueError('only on one')" in traceback


@pytest.mark.slurm
@pytest.mark.slow
def test_a_hang_on_two_nodes_stops_at_the_timeout_and_ends_the_job(shell, clean):
    result = shell.run_cell("%%torchrun --nnodes 2 --nproc-per-node 2 --timeout 5\n"
                            "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                            "if dist.get_rank() == 2:\n    dist.recv(torch.zeros(1), src=1)  # rank 1 never sends\n"
                            "else:\n    dist.barrier()  # nor do the others end: their processes would be gone\n",
                            store_history=False)
    err = result.error_in_exec
    assert isinstance(err, ppkit.JobTimeoutError) and err.ranks == [0, 1, 2, 3], err
    assert "within 5 s (%%torchrun's timeout)" in str(err)
    assert "dist.recv(torch.zeros(1), src=1)" in err.stacks[2]


@pytest.mark.slurm
@pytest.mark.slow
def test_kernel_interrupt_on_two_nodes_says_where_each_rank_waited_and_ends_the_job(shell, clean, tmp_path):
    from ppkit.cluster.torchrun import magic

    def interrupt_when_all_started():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started-*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # what Kernel > Interrupt does

    threading.Thread(target=interrupt_when_all_started, daemon=True).start()
    with pytest.raises(ppkit.JobInterrupted) as info:
        magic.torchrun(f"--nnodes 2 --nproc-per-node 2 -- {tmp_path}", "import os, sys\n"
                       "open(os.path.join(sys.argv[1], 'started-' + os.environ['RANK']), 'w').close()\n"
                       "while True:\n    sum(range(1000))\n")
    assert str(info.value).startswith("interrupted. Every process of this call has been stopped. The next %%torchrun")
    assert all("sum(range(1000))" in info.value.stacks[r] for r in range(4))


ALLOCATED = textwrap.dedent("""
    import os, subprocess, ppkit

    def main():
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        total = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(total)
        e = os.environ
        print("FACTS", e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"],
              e["GROUP_WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["SLURMD_NODENAME"], int(total.item()),
              e["SLURM_JOB_ID"], flush=True)
        dist.destroy_process_group()

    ppkit.torchrun(main, nproc_per_node=2, nnodes=2, collapse=False)  # each rank's FACTS line, unfolded
    print("QUEUE", subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split())
    try:
        ppkit.torchrun(main, nproc_per_node=1, nnodes=3)
    except ppkit.ConfigError as exc:
        print("REFUSED", exc)
""")


@pytest.mark.slurm
@pytest.mark.slow
def test_inside_an_allocation_ppkit_torchrun_on_two_nodes_is_a_step_of_it(clean):
    proc = clean.run(["salloc", "-N", "2", sys.executable, "-c", ALLOCATED], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = re.search(r"a step of your allocation (\d+) \(2 nodes, 4 tasks\)", proc.stdout).group(1)
    assert "submitted" not in proc.stdout
    found = facts(proc.stdout)
    assert {f.pop() for f in found.values()} == {job}  # SLURM_JOB_ID: the allocation's own
    check_two_by_two(found)
    assert f"QUEUE ['{job}']" in proc.stdout  # no job of its own
    assert f"REFUSED nnodes=3 is more than the 2 node(s) of your allocation {job}" in proc.stdout


def test_without_slurm_nnodes_says_what_it_needs(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ppkit.ConfigError, match=r"nnodes=2 runs the ranks on 2 nodes of a SLURM cluster, and "
                                                r"SLURM's commands \(sbatch, srun.*\) are not on PATH"):
        ppkit.torchrun(print, nproc_per_node=2, nnodes=2)
    from ppkit.cluster.torchrun import magic

    with pytest.raises(ppkit.ConfigError, match=r"--nnodes 3 runs the ranks on 3 nodes"):
        magic.torchrun("--nnodes 3 --nproc-per-node 1", "print('never runs')")


def test_torchruns_variables_follow_where_slurm_put_each_rank_and_a_wrong_placement_is_refused():
    from ppkit.cluster.torchrun import nodes, options

    launch = options.parse(["--nnodes", "2", "--nproc-per-node", "2"], cell=True)
    store = ("10.0.0.1", 29511)
    env, own = nodes.environment(launch, [(0, 0, "a", store), (0, 1, "a", None), (1, 0, "b", None), (1, 1, "b", None)])
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == \
        ("4", "2", "2", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29511")
    assert [(o["RANK"], o["LOCAL_RANK"], o["GROUP_RANK"]) for o in own] == \
        [("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    for placed in ([(0, 0, "a", store), (0, 1, "a", None), (0, 2, "a", None), (1, 0, "b", None)],  # 3 and 1
                   [(0, 0, "a", store), (0, 1, "a", None), (1, 0, "a", None), (1, 1, "b", None)],  # rank 2 on a
                   [(0, 0, "a", store), (0, 1, "a", None), (1, 0, "a", None), (1, 1, "a", None)]):  # one machine
        with pytest.raises(ppkit.LaunchError, match=r"SLURM placed the ranks as \{'node 0 \(a\)': \[0, 1"):
            nodes.environment(launch, placed)


@pytest.mark.parametrize("nnodes", [0, "2", True])
def test_a_bad_nnodes_is_refused(nnodes):
    with pytest.raises(ppkit.ConfigError, match="nnodes must be a whole number of nodes"):
        ppkit.torchrun(print, nproc_per_node=2, nnodes=nnodes)
