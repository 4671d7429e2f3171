"""Profiling in a real Jupyter kernel (issue 40): ``%%torchrun --profile``, ``ppkit.spawn(...,
profile=True)`` and ``%%ranks --profile`` on a 2-rank DDP step give a Profile that shows as one
timeline of both ranks, loads nothing from the network, saves one trace and sums every rank up. One
kernel serves every scenario; the module's end checks that no ppkit process outlives it."""

from __future__ import annotations

import json

import pytest
from kernels import kernel_after
from test_debugger import run_cell

pytestmark = pytest.mark.slow

START = """
import json, os, re
import ppkit
%load_ext ppkit

def ddp_step(rank, world_size):
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    model(torch.randn(16, 64)).sum().backward()

def facts(prof, path):
    # what the notebook shows for the profile (its display data, as sent to the front end), its
    # saved trace and its summary, as one JSON line
    data, _ = get_ipython().display_formatter.format(prof)
    page = data.get("text/html", "")
    trace = json.load(open(prof.save(path)))
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    named = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    print(json.dumps({
        "type": type(prof).__name__,
        "rows": [json.dumps(f"rank {r} · main")[1:-1] in page for r in (0, 1)],
        "plotly": "Plotly.newPlot" in page,
        "remote": re.findall(r"<(?:script|link|img)[^>]*(?:src|href)\\s*=\\s*['\\"]?https?://", page),
        "named": named,
        "aten": sorted({e["pid"] for e in ops if e["name"].startswith("aten::")}),
        "all_reduce": sorted({e["pid"] for e in ops if "all_reduce" in e["name"] or "allreduce" in e["name"]}),
        "summary": [{k: row[k] for k in ("rank", "compute_ms", "communication_ms", "overlapped_ms", "idle_ms")}
                    for row in prof.summary().rows],
        "own": [json.load(open(os.path.splitext(path)[0] + f".ranks/rank{r}.pt.trace.json"))["distributedInfo"]
                for r in (0, 1)],  # each rank's own trace, saved beside the merged one
    }))
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with kernel_after(tmp_path_factory.mktemp("notebook"), START, run_cell) as kernel:
        yield kernel


def shown(kc, code: str) -> dict:
    cell = run_cell(kc, code)
    assert cell.error is None, cell.text
    return json.loads(cell.text.strip().splitlines()[-1])


def check(facts: dict) -> None:
    assert facts["type"] == "Profile"
    assert facts["rows"] == [True, True] and facts["plotly"]  # one row per rank, drawn by plotly
    assert facts["remote"] == []  # nothing from http(s)://
    assert sorted(facts["named"]) == ["0", "1"] and facts["named"]["1"].startswith("rank 1")
    assert facts["aten"] == [0, 1] and facts["all_reduce"] == [0, 1]
    assert [(info["rank"], info["world_size"]) for info in facts["own"]] == [(0, 2), (1, 2)]
    for rank, row in enumerate(facts["summary"]):
        assert row["rank"] == rank
        assert row["compute_ms"] > 0 and row["communication_ms"] > 0
        assert 0 <= row["overlapped_ms"] <= row["communication_ms"] and row["idle_ms"] >= 0


def test_torchrun_cell_with_profile_gives_the_profile_as_its_value(kernel):
    _, kc = kernel
    cell = run_cell(kc, """
        %%torchrun --nproc-per-node 2 --profile
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
        model(torch.randn(16, 64)).sum().backward()
        print("step done", flush=True)
        """)
    assert cell.error is None, cell.text
    assert "step done" in cell.text and "<ppkit.Profile: 2 ranks" in cell.text
    assert "USDT" not in cell.text and "gpuGetDeviceCount" not in cell.text  # kineto's own lines kept out
    check(shown(kc, "facts(_, 'torchrun.json')"))


def test_spawn_with_profile_returns_a_profile(kernel):
    _, kc = kernel
    check(shown(kc, """
        def spawned(rank, world_size):
            import torch.distributed as dist
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            ddp_step(rank, world_size)
        from ppkit.cluster.worker_setup import free_port
        os.environ["PORT"] = str(free_port())
        facts(ppkit.spawn(spawned, args=(2,), nprocs=2, profile=True), "spawn.json")
        """))


def test_ranks_cell_with_profile_on_the_current_cluster(kernel):
    _, kc = kernel
    cell = run_cell(kc, "cluster = ppkit.start(2, timeout=60)")
    assert cell.error is None, cell.text
    try:
        cell = run_cell(kc, """
            %%ranks --profile
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
            model(torch.randn(16, 64)).sum().backward()
            """)
        assert cell.error is None, cell.text
        assert "<ppkit.Profile: 2 ranks" in cell.text
        check(shown(kc, "facts(_, 'ranks.json')"))
    finally:
        run_cell(kc, "cluster.close()")
