"""``%%torchrun --max-restarts N`` and ``ppkit.torchrun(..., max_restarts=N)``: when a rank fails, every rank
stops and the whole group starts again, as torchrun's agent does, side by side with a real torchrun on the
same failing script; each attempt has a rendezvous of its own; the cell shows each restart's cause; Kernel >
Interrupt ends it at once; no process is left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from IPython.core.error import UsageError
from leftovers import end_leftovers, ppkit_children

import ppkit
from ppkit.cluster.spawn import call as spawn_call

# rank 1 fails on its first two attempts; each rank writes what it saw, one file per attempt, once its
# process group works (a restarted rank that cannot rendezvous writes no "reached")
FAILING = '''\
import json, os, sys
import torch, torch.distributed as dist

folder, rank = sys.argv[1], int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
seen = {k: v for k, v in os.environ.items() if k.startswith("TORCHELASTIC_")}
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
seen["reached"] = total.item()
with open(os.path.join(folder, f"attempt{attempt}-rank{rank}.json"), "w") as file:
    json.dump(seen, file)
if rank == 1 and attempt < 2:
    raise RuntimeError(f"rank 1 fails on attempt {attempt}")
dist.destroy_process_group()
'''
SAME_RUN = ("TORCHELASTIC_RUN_ID",)  # a uuid of each run, the same for all its attempts
# TORCHELASTIC_ERROR_FILE: environ.LEFT_OUT. TORCHELASTIC_USE_AGENT_STORE: torchrun says False once its
# store is not shared (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1); ppkit's ranks join their attempt's own store
NOT_COMPARED = ("TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE")


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext ppkit", store_history=False)
    yield shell
    spawn_call.close()
    assert end_leftovers([p.pid for p in ppkit_children()]) == []


def assert_ranks_gone() -> None:
    """Only the fork servers ppkit.spawn keeps may stay after a run."""
    ranks = [p.pid for p in ppkit_children() if "ppkit.transport.zygote" not in " ".join(p.cmdline())
             or p.ppid() != os.getpid()]
    assert end_leftovers(ranks) == []


def attempts(folder) -> dict[tuple[int, int], dict]:
    found = {}
    for path in folder.glob("attempt*-rank*.json"):
        attempt, rank = map(int, re.findall(r"\d+", path.stem))
        found[attempt, rank] = json.loads(path.read_text())
    return found


def compared(seen: dict) -> dict:
    return {k: v for k, v in seen.items() if k not in SAME_RUN + NOT_COMPARED}


@pytest.mark.slow
def test_max_restarts_restarts_as_a_real_torchrun_does_with_the_same_environment(shell, tmp_path, monkeypatch,
                                                                                capfd):
    (tmp_path / "fail.py").write_text(FAILING)
    real, cell = tmp_path / "real", tmp_path / "cell"
    real.mkdir()
    cell.mkdir()
    # without it, torchrun 2.14.1's restarted ranks read the last attempt's gloo addresses from the agent's
    # store, which it shares with them, and often fail in connectFullMesh ("Connection refused"; docs/faults.md)
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "2", "fail.py", str(real)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    result = shell.run_cell(f"%torchrun --standalone --nproc-per-node 2 --max-restarts 2 fail.py {cell}",
                            store_history=False)
    assert result.success, result.error_in_exec
    assert_ranks_gone()

    theirs, ours = attempts(real), attempts(cell)
    assert sorted(ours) == sorted(theirs) == [(a, r) for a in range(3) for r in range(2)]  # the same restarts
    assert {key: compared(seen) for key, seen in ours.items()} == {key: compared(seen) for key, seen in theirs.items()}
    assert ours[0, 0]["TORCHELASTIC_RESTART_COUNT"] == "0" and ours[2, 1]["TORCHELASTIC_MAX_RESTARTS"] == "2"
    for run in (ours, theirs):
        assert len({seen["TORCHELASTIC_RUN_ID"] for seen in run.values()}) == 1  # one run id for every attempt
    out = capfd.readouterr()
    shown = out.out + out.err
    for attempt in (0, 1):
        assert re.search(rf"\[ppkit\] attempt {attempt} of 3 failed: rank 1 \(pid \d+\) raised RuntimeError: "
                         rf"rank 1 fails on attempt {attempt}\. Every rank was stopped; restart {attempt + 1} of 2 "
                         "starts them all again", shown), shown[-3000:]
    assert "attempt 2 of 3 failed" not in shown


def store_left_over(attempts_folder: str):
    """Attempt 0 writes a key in its store and fails; attempt 1 says whether it can read it."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    if attempt == "0":
        store.set("written by attempt 0", "stale")
    dist.barrier()
    with open(os.path.join(attempts_folder, f"{attempt}-{rank}"), "w") as file:
        json.dump({"port": os.environ["MASTER_PORT"], "stale": store.check(["written by attempt 0"])}, file)
    if attempt == "0" and rank == "1":
        raise RuntimeError("rank 1 fails once")
    dist.destroy_process_group()


@pytest.mark.slow
def test_each_attempt_has_a_new_rendezvous_that_reads_nothing_of_the_last(shell, tmp_path):
    ppkit.torchrun(store_left_over, args=(str(tmp_path),), nproc_per_node=2, max_restarts=1)
    seen = {path.name: json.loads(path.read_text()) for path in tmp_path.iterdir()}
    assert sorted(seen) == ["0-0", "0-1", "1-0", "1-1"]
    assert seen["0-0"]["stale"] and not seen["1-0"]["stale"] and not seen["1-1"]["stale"]
    assert seen["0-0"]["port"] != seen["1-0"]["port"]  # a free port for each attempt
    assert_ranks_gone()


@pytest.mark.slow
def test_the_last_attempts_error_says_each_earlier_cause(shell, capsys):
    result = shell.run_cell("%%torchrun --nproc-per-node 2 --max-restarts 1\nimport os\n"
                            "if os.environ['RANK'] == '0' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
                            "    os._exit(3)\n"
                            "if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == '1':\n"
                            "    raise ValueError('first line\\nlast line')\n", store_history=False)
    err = result.error_in_exec
    assert isinstance(err, ppkit.ProcessRaisedError) and err.error_index == 1
    assert err.attempt_causes[0].startswith("rank 0 (pid ") and err.attempt_causes[0].endswith("exit code 3")
    assert err.attempt_causes[1].endswith("raised ValueError: last line")
    note = "\n".join(err.__notes__)
    assert "%%torchrun ran 2 attempts (--max-restarts 1) and each failed; this is the last one's error. " \
           "Earlier: attempt 0: rank 0 (pid " in note
    out = capsys.readouterr().out
    assert re.search(r"\[ppkit\] attempt 0 of 2 failed: rank 0 \(pid \d+\) ended with exit code 3\.", out), out
    assert "attempt 1 of 2 failed" not in out  # the last one is the error, not a restart
    assert_ranks_gone()


@pytest.mark.slow
def test_kernel_interrupt_during_a_restarted_attempt_ends_the_run_at_once(shell, tmp_path):
    from ppkit.cluster.torchrun import magic

    def interrupt_when_attempt_1_started():
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("started-1-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # what Kernel > Interrupt does

    threading.Thread(target=interrupt_when_attempt_1_started, daemon=True).start()
    with pytest.raises(ppkit.JobInterrupted) as info:
        magic.torchrun(f"--nproc-per-node 2 --max-restarts 5 -- {tmp_path}", "import os, sys\n"
                       "attempt = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
                       "open(os.path.join(sys.argv[1], f'started-{attempt}-' + os.environ['RANK']), 'w').close()\n"
                       "if attempt == '0' and os.environ['RANK'] == '1':\n    raise RuntimeError('once')\n"
                       "while True:\n    sum(range(1000))\n")
    assert str(info.value).startswith("interrupted. Every process of this call has been stopped.")
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0-0", "started-0-1", "started-1-0",
                                                                   "started-1-1"]  # no attempt after it
    assert_ranks_gone()


@pytest.mark.parametrize(("line", "named"), [
    ("--max-restarts -1", "--max-restarts -1: give how many times every rank may start again"),
    ("--max-restarts 1 --nnodes 2", "--max-restarts 1 with 2 nodes: ppkit restarts the ranks of a run on this "
                                    "machine only"),
])
def test_a_max_restarts_that_cannot_be_honoured_is_a_usage_error(line, named):
    from ppkit.cluster.torchrun import magic

    with pytest.raises(UsageError, match=f"^%%torchrun: {named}"):
        magic.torchrun(line, "print('never runs')")


def test_max_restarts_is_read_from_torchruns_spellings():
    from ppkit.cluster.torchrun import options

    assert options.parse(["--max-restarts", "2"], cell=True).max_restarts == 2
    assert options.parse(["--max_restarts=3", "--nproc-per-node", "2"], cell=True).max_restarts == 3
    assert options.parse([], cell=True).max_restarts == 0


@pytest.mark.parametrize("value", [-1, "2", 1.5, True])
def test_ppkit_torchrun_refuses_a_max_restarts_that_is_not_a_count(value):
    with pytest.raises(ppkit.ConfigError, match="max_restarts=.*: give how many times every rank may start again"):
        ppkit.torchrun(store_left_over, args=("x",), nproc_per_node=2, max_restarts=value)
