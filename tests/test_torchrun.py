"""%%torchrun, %torchrun and ppkit.torchrun, driven through one IPython shell as a notebook would:
a torchrun script (argparse, ``if __name__ == "__main__"``, a module beside the notebook) gets the
environment a real torchrun gives its workers, tensor/sequence parallel and FSDP2 with DCP run as
written, and failures, hangs and bad options end as the learner needs. One shell and the fork
servers ppkit.spawn keeps are shared by every test; each run's processes are gone when it returns."""

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
import torch
import torch.distributed as dist
from IPython.core.error import UsageError
from leftovers import end_leftovers, ppkit_children

import ppkit
from ppkit.cluster.spawn import call as spawn_call
from ppkit.cluster.torchrun import environ, options
from ppkit.lessons.data_parallel import free_port

SCRIPT = '''\
import argparse, json, logging, os, sys
import torch
import torch.distributed as dist
from helper import WORD  # a module in the notebook's (the script's) folder


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--dcp-api", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")  # no rank arguments: torchrun's environment has them
    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    logging.basicConfig(level=logging.INFO)
    logging.info("rank %d logged", dist.get_rank())
    facts = {"keys": sorted(os.environ), "name": __name__, "args": sys.argv[1:], "dcp_api": args.dcp_api,
             "sum": total.item(), "word": WORD, "cwd": os.getcwd(), "pid": os.getpid(),
             "threads": torch.get_num_threads()}
    with open(os.path.join(args.out, os.environ["RANK"] + ".json"), "w") as file:
        json.dump(facts, file)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext ppkit", store_history=False)
    yield shell
    spawn_call.close()  # the fork servers kept between runs: nothing of ppkit's may outlive the module
    assert end_leftovers([p.pid for p in ppkit_children()]) == []


def run_cell(shell, source: str):
    return shell.run_cell(source, store_history=False)


def assert_ranks_gone() -> None:
    """Only the fork servers ppkit.spawn keeps may stay after a run."""
    ranks = [p.pid for p in ppkit_children() if "ppkit.transport.zygote" not in " ".join(p.cmdline())
             or p.ppid() != os.getpid()]
    assert end_leftovers(ranks) == []


def printed(out: str) -> set[tuple[int, str]]:
    """Each ``(rank, line)`` the cell showed: a collapsed ``[ranks 0-1] ...`` counts for each of its ranks."""
    seen = set()
    for match in re.finditer(r"^\[ranks? ([\d,-]+)\] (.*)$", out, re.M):
        for part in match[1].split(","):
            low, _, high = part.partition("-")
            seen.update((rank, match[2]) for rank in range(int(low), int(high or low) + 1))
    return seen


def facts(folder) -> dict:
    return {int(p.stem): json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


@pytest.mark.slow
def test_a_torchrun_script_runs_as_in_torchrun_in_the_cell_and_from_its_file(shell, tmp_path, monkeypatch, capfd):
    (tmp_path / "helper.py").write_text("WORD = 'found beside the notebook'\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    outs = {name: tmp_path / name for name in ("torchrun", "cell", "again", "file")}
    for out in outs.values():
        out.mkdir()
    before = dict(os.environ)  # passed on as it is (readline puts LINES and COLUMNS in the C-level environment)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py", "--out",
                    str(outs["torchrun"]), "--dcp-api"], cwd=tmp_path, env=before, check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)  # the notebook's folder
    port = free_port()
    for name in ("cell", "again"):  # the same port twice: every run has fresh processes
        result = run_cell(shell, f"%%torchrun --nproc_per_node=2 --master-port {port} -- --out {outs[name]} "
                                 f"--dcp-api\n{SCRIPT}")
        assert result.success, result.error_in_exec
    result = run_cell(shell, f"%torchrun --nproc-per-node 2 --standalone train.py --out {outs['file']} --dcp-api")
    assert result.success, result.error_in_exec
    assert_ranks_gone()

    real, cell, again, file = (facts(outs[name]) for name in ("torchrun", "cell", "again", "file"))
    for run in (cell, again, file):
        assert sorted(run) == [0, 1]
        for rank in (0, 1):
            same = ("name", "dcp_api", "sum", "word", "cwd", "threads")
            assert {k: run[rank][k] for k in same} == {k: real[rank][k] for k in same}
            assert run[rank]["args"] == ["--out", run[rank]["args"][1], "--dcp-api"]
    assert cell[0]["name"] == "__main__" and cell[0]["sum"] == 3.0
    assert {r["pid"] for r in cell.values()}.isdisjoint(r["pid"] for r in again.values())
    added = {name: set(run[0]["keys"]) - set(before) for name, run in (("real", real), ("cell", cell))}
    assert added["real"] - added["cell"] == set(environ.LEFT_OUT), "keys torchrun sets that %%torchrun does not"
    assert {k for k in added["cell"] - added["real"] if not k.startswith("PPKIT_")} <= set(environ.ADDED)
    out = capfd.readouterr()
    # rank 1's line, or both ranks' folded into one (cluster/output/fold.py)
    assert re.search(r"\[rank 1\] INFO:root:rank 1 logged|\[ranks 0-1\] INFO:root:rank 0…1 logged", out.out + out.err)


@pytest.mark.slow
def test_tensor_and_sequence_parallel_with_init_device_mesh(shell, capsys):
    result = run_cell(shell, '''%%torchrun --nproc-per-node 2 --standalone
import copy
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(8), torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(self.norm(x))))

torch.manual_seed(0)
mesh = init_device_mesh("cpu", (2,))
model = Block()
reference = copy.deepcopy(model)
parallelize_module(model, mesh, {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                                 "down": RowwiseParallel(output_layouts=Shard(1))})
x = torch.randn(2, 6, 8)  # (batch, sequence, features), the same on every rank
rank = dist.get_rank()
local = model(x.chunk(2, dim=1)[rank])  # each rank holds its half of the sequence
same = torch.allclose(local, reference(x).chunk(2, dim=1)[rank], atol=1e-5)
print("matches", same, tuple(model.up.weight.to_local().shape))
''')
    assert result.success, result.error_in_exec
    assert {(0, "matches True (8, 8)"), (1, "matches True (8, 8)")} <= printed(capsys.readouterr().out)


def train_fsdp2(folder, steps=3):
    """A torchrun script's main() for FSDP2 and DCP: no rank argument, the environment says."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    dist.init_process_group("gloo")
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + dist.get_rank())
    for _ in range(steps):
        model(torch.randn(4, 8)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
    loaded = build()
    state = {"model": loaded.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    loaded.load_state_dict(state["model"])
    same = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(model.parameters(), loaded.parameters()))
    print("round trip", same, tuple(model[0].weight.to_local().shape), os.environ["LOCAL_WORLD_SIZE"])
    dist.destroy_process_group()


@pytest.mark.slow
def test_ppkit_torchrun_runs_fsdp2_and_dcp_on_4_ranks(shell, tmp_path, capsys):
    assert ppkit.torchrun(train_fsdp2, kwargs={"folder": str(tmp_path / "checkpoint")}, nproc_per_node=4) is None
    out = capsys.readouterr().out
    assert {(r, "round trip True (4, 8) 4") for r in range(4)} <= printed(out), out
    assert (tmp_path / "checkpoint" / ".metadata").exists()
    assert_ranks_gone()


@pytest.mark.slow
def test_a_failing_rank_names_its_rank_and_the_cells_line(shell):
    result = run_cell(shell, "%%torchrun --nproc-per-node 2\nimport os\nx = 1\nif os.environ['RANK'] == '1':\n"
                             "    raise ValueError('only on one')\n")
    err = result.error_in_exec
    assert isinstance(err, ppkit.ProcessRaisedError) and err.error_index == 1
    message = str(err)
    assert message.startswith("rank 1 of 2 (pid ") and "raised ValueError: only on one" in message
    assert "Every process of this call has been stopped. The next %%torchrun starts fresh ones." in message
    traceback = message.split("--- traceback in rank 1 ---\n")[1]
    assert traceback.startswith('Traceback (most recent call last):\n  File "<%%torchrun cell')
    assert "line 4, in <module>\n    raise ValueError('only on one')" in traceback  # the cell's own line
    assert_ranks_gone()  # a bare InteractiveShell keeps no rank for %debug: no learner types the next cell


@pytest.mark.slow
def test_a_hang_stops_at_the_timeout_and_says_where_each_rank_waited(shell):
    result = run_cell(shell, "%%torchrun --nproc-per-node 2 --timeout 4\nimport torch, torch.distributed as dist\n"
                             "dist.init_process_group('gloo')\nif dist.get_rank() == 0:\n"
                             "    dist.recv(torch.zeros(1), src=1)  # rank 1 never sends\n"
                             "else:\n    dist.barrier()  # nor ends: its process would be gone\n")
    err = result.error_in_exec
    assert isinstance(err, ppkit.JobTimeoutError) and err.ranks == [0, 1]
    assert "within 4 s (%%torchrun's timeout)" in str(err) and "%%torchrun --timeout SECONDS" in str(err)
    assert "dist.recv(torch.zeros(1), src=1)" in err.stacks[0]
    assert_ranks_gone()


@pytest.mark.parametrize(("line", "named"), [
    ("--nnodes 1:2", "--nnodes 1:2: ppkit does not grow or shrink a run"),
    ("--standalone --nnodes 2", "--standalone is"),
    ("--nnodes 2 --node-rank 1", "--node-rank 1: one cell starts every node's ranks"),
    ("--no-such-option", "unrecognized arguments: --no-such-option"), ("train.py", "'train.py' cannot be a script"),
    ("--nproc-per-node 0", "--nproc-per-node 0"), ("--timeout -1", "--timeout -1"),
    ("-m pkg.train", "-m runs a module, and %%torchrun runs the cell itself. Write %torchrun"),
    ("--rdzv-backend etcd", "--rdzv-backend etcd: .* Write --rdzv-backend c10d"),
    ("--rdzv-conf read_timeout=5", "--rdzv-conf read_timeout=5: ppkit's rendezvous .* has no settings"),
    ("--rdzv-endpoint host:port", "--rdzv-endpoint host:port: .* Give HOST:PORT"),
    ("--numa-binding node", "--numa-binding node: ppkit does not bind"),
    ("--duplicate-stdout-filters loss", "--duplicate-stdout-filters \\['loss'\\]: .* --tee 3 --log-dir DIR"),
    ("--tee 4", "--tee 4: give 0 \\(none\\), 1 \\(stdout\\)"),
    ("--redirects 5:3", "--redirects 5:3: names local rank 5"),
    ("--local-ranks-filter 2", "--local-ranks-filter 2: give local ranks of this run, 0 to 0"),
    ("--nproc-per-node xpu", "--nproc-per-node xpu: give a number"),
])
def test_an_unsupported_option_is_a_usage_error_naming_it(line, named):
    from ppkit.cluster.torchrun import magic

    with pytest.raises(UsageError, match=f"^%%torchrun: .*{named}"):
        magic.torchrun(line, "print('never runs')")


def test_torchruns_spellings_are_accepted():
    for line in (["--nproc-per-node", "2", "--master-port", "29500"], ["--nproc_per_node=2", "--master_port=29500"],
                 ["--standalone", "--nnodes", "1", "--nproc-per-node", "2", "--master-port", "29500"]):
        launch = options.parse(line, cell=True)
        assert (launch.nproc_per_node, launch.script_args) == (2, ())
    assert options.parse(["--nproc-per-node", "2", "train.py", "--dcp-api"], cell=False).script_args == ("--dcp-api",)
    assert options.parse(["--", "--epochs", "3"], cell=True).script_args == ("--epochs", "3")


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ppkit.torchrun(3), "needs the function"),
    (lambda: ppkit.torchrun(train_fsdp2, nproc_per_node=2), "cannot be called as train_fsdp2"),
    (lambda: ppkit.torchrun(train_fsdp2, args=("x",), nproc_per_node=0), "nproc_per_node must be"),
    (lambda: ppkit.torchrun(train_fsdp2, args=("x",), master_port="29500"), "master_port must be a TCP port"),
])
def test_bad_arguments_to_ppkit_torchrun_are_refused_before_anything_starts(call, message):
    with pytest.raises(ppkit.ConfigError, match=message):
        call()


@pytest.mark.slow
def test_kernel_interrupt_stops_every_rank_and_says_where_each_waited(shell, tmp_path):
    from ppkit.cluster.torchrun import magic

    def interrupt_when_both_started():
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # what Kernel > Interrupt does

    threading.Thread(target=interrupt_when_both_started, daemon=True).start()
    with pytest.raises(ppkit.JobInterrupted) as info:
        magic.torchrun(f"--nproc-per-node 2 -- {tmp_path}", "import os, sys\n"
                       "open(os.path.join(sys.argv[1], 'started-' + os.environ['RANK']), 'w').close()\n"
                       "while True:\n    sum(range(1000))\n")
    err = info.value
    assert str(err).startswith("interrupted. Every process of this call has been stopped. The next %%torchrun")
    assert all("sum(range(1000))" in err.stacks[r] for r in (0, 1))
    assert_ranks_gone()


@pytest.mark.slow
def test_what_cannot_be_pickled_is_named(shell):
    with pytest.raises(ppkit.ConfigError, match=r"ppkit.torchrun cannot send args\[1\] \(lock\)"):
        ppkit.torchrun(lambda a, b: None, args=(1, threading.Lock()), nproc_per_node=2)
    assert_ranks_gone()


def test_a_missing_script_says_where_it_was_looked_for(tmp_path, monkeypatch):
    from ppkit.cluster.torchrun import magic

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ppkit.ConfigError, match=rf"cannot read the script 'missing.py' .* folder, {tmp_path}"):
        magic.torchrun("--nproc-per-node 2 missing.py --epochs 3")


def test_a_taken_master_port_says_so_and_what_to_do():
    # in-process: a port the kernel holds does not clash with the ranks', which are in the learner's
    # private network where the machine allows one (docs/isolation.md)
    import socket

    from ppkit.cluster.torchrun import rank

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ppkit.ConfigError, match=f"rank 0 cannot host the rendezvous store on 127.0.0.1:{port}: "
                                                    "Address already in use.* Leave --master-port out"):
            rank.host_store("127.0.0.1", port, 2)
    with pytest.raises(ppkit.ConfigError, match="on 192.0.2.1:29500: .* leave --master-addr out"):
        rank.host_store("192.0.2.1", 29500, 2)  # an address of no interface here (TEST-NET-1)
