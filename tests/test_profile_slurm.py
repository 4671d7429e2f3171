"""Profiling ranks on two SLURM nodes (tests/slurm_testbed.py: n1, n2) on one clock: each rank's clock
offset is measured over ppkit's channel (ppkit/profiling/clocks.py), and the all-reduce that both
ranks take part in lines up in the merged timeline."""

from __future__ import annotations

import os

import pytest
from leftovers import end_leftovers, ppkit_children

import ppkit

TOLERANCE_US = 5_000.0  # beyond the offsets' own error bound: two busy cores, and gloo's own wake-ups


def main():
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        time.sleep(0.2)  # rank 0's all_reduce starts first and waits: both end together
    total = torch.ones(1 << 16)
    dist.all_reduce(total)
    print("node", os.environ["SLURMD_NODENAME"], "total", int(total[0]), flush=True)
    dist.destroy_process_group()


@pytest.mark.slurm
@pytest.mark.slow
def test_two_ranks_on_two_nodes_are_on_one_clock(slurm_clean, capsys):
    try:
        prof = ppkit.torchrun(main, nproc_per_node=1, nnodes=2, profile=True, timeout=180)
    finally:
        slurm_clean.wait_no_jobs(timeout=20)
        left = end_leftovers([p.pid for p in ppkit_children() if p.ppid() != os.getpid()
                              or "ppkit.transport.zygote" not in " ".join(p.cmdline())], timeout=10.0)
        assert not left, f"leftover ppkit processes (now killed): {left}"
    out = capsys.readouterr().out
    assert "node n1 total 2" in out and "node n2 total 2" in out, out
    assert sorted(prof.ranks) == [0, 1] and sorted(prof.offsets) == [0, 1]
    for offset in prof.offsets.values():  # the testbed's nodes share this machine's clock
        assert abs(offset.offset_us) <= offset.error_us + TOLERANCE_US, prof.offsets
    reduces = {}
    for event in prof.events(kind="communication"):
        if event["name"] == "gloo:all_reduce" and event["dur_us"] > 0:
            reduces.setdefault(event["rank"], event)  # the one all_reduce of each rank
    assert sorted(reduces) == [0, 1], prof.events(kind="communication")
    end = {rank: e["start_us"] + e["dur_us"] for rank, e in reduces.items()}
    # rank 0 waited for rank 1 (its sleep): its all_reduce began ~0.2 s earlier, and both ended together
    assert reduces[1]["start_us"] - reduces[0]["start_us"] > 100_000, reduces
    assert abs(end[0] - end[1]) <= max(o.error_us for o in prof.offsets.values()) + TOLERANCE_US, reduces
    assert {row["rank"] for row in prof.summary().rows} == {0, 1}
