"""What a hostile review of the doctor's records found, on real gloo ranks: the wrapper around
ProcessGroup's calls changes no behaviour (keywords pass through) and costs the same at any stack
depth; the API name of an object collective; ranks whose main thread waits are not "in their own
code"; a correct DTensor-style call is not "a difference"; ranks that disagree on a group's members.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import ppkit
from ppkit.lessons.data_parallel import free_port

pytestmark = pytest.mark.timeout(300)


def join(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def keyword_send_recv(rank, world_size):
    """ProcessGroup.send/recv called with pybind's keyword names, as torch's own code may."""
    from ppkit.transport import flight_calls

    pg = dist.group.WORLD
    t = torch.full((2,), float(rank + 1))
    work = pg.send([t], dstRank=1, tag=5) if rank == 0 else pg.recv([t], srcRank=0, tag=5)
    work.wait()
    kept = [(call.op, call.peer, call.tag) for call in flight_calls.p2p_ring]
    return t.tolist(), kept


def test_the_wrapper_passes_keywords_through(cluster2):
    results = cluster2.run(keyword_send_recv)
    assert results[1][0] == [1.0, 1.0], results
    assert results[0][1][-1] == ("isend", 1, 5) and results[1][1][-1] == ("irecv", 0, 5), results


SINGLE_RANK = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    from ppkit.transport import flight_calls
    t = torch.ones(1)
    def per_call(n=1000):
        for _ in range(100): dist.all_reduce(t)
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n): dist.all_reduce(t)
            best.append((time.perf_counter() - t0) / n)
        return min(best)
    def deep(k):
        return per_call() if k == 0 else deep(k - 1)
    bare = deep(600) / per_call()  # torch's own cost grows with depth: its record captures the stack
    flight_calls.watch()
    objs = [None]
    dist.all_gather_object(objs, {"a": 1})
    print("api", [call[4] for call in flight_calls.api_ring][-2:])
    shallow, deep_s = per_call(), deep(600)
    print(f"wrapped {shallow * 1e6:.1f} us, at depth 600 {deep_s * 1e6:.1f} us; unwrapped ratio {bare:.2f}")
    print("ratio", deep_s / shallow / bare)
    dist.destroy_process_group()
""")


def test_the_wrappers_cost_does_not_grow_with_stack_depth_and_names_object_collectives(tmp_path):
    """Each call walked the whole stack twice: at depth 300 a call cost 4.5 times one at depth 0, where
    torch's own cost grows 1.3 times. Compared as the growth with the wrapper over the growth without."""
    script = tmp_path / "learner.py"  # a learner's file: where the walk stops
    script.write_text(SINGLE_RANK)
    out = subprocess.run([sys.executable, str(script), str(free_port())], capture_output=True, text=True,
                         timeout=240, check=True).stdout
    assert "api ['all_gather_object', 'all_gather_object']" in out, out
    ratio = float(out.split("ratio")[1])
    assert ratio < 1.6, out


def dtensor_redistribute(rank, world_size):
    """Correct: a Shard(0) -> Replicate redistribute (funcol's all_gather_into_tensor), the same on every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    full = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]).redistribute(mesh, [Replicate()]).to_local()
    return full.tolist()


def test_a_correct_redistribute_is_not_called_a_difference(cluster2):
    """torch's matcher checks one all_gather_into_tensor's own numel, as gloo records it; both ranks'
    calls are the same, so nothing differs between them."""
    assert cluster2.run(dtensor_redistribute) == [[0.0, 1.0, 2.0, 3.0]] * 2
    diagnosis = ppkit.collective_doctor(cluster2)
    text = str(diagnosis)
    assert "differ" not in text and not diagnosis.problem, text


def reduce_scatter_against_all_reduce(rank, world_size):
    out = torch.zeros(2)
    if rank < 2:
        dist.reduce_scatter(out, [torch.ones(2) for _ in range(world_size)])
    else:
        dist.all_reduce(out)
    dist.barrier()


def test_the_learners_calls_are_compared_where_the_backend_records_the_same_op(cluster4):
    """gloo records a list-form reduce_scatter as all_reduces: rank 2's all_reduce pairs with the others'
    first piece, and the backend's ops agree at #1."""
    with pytest.raises(ppkit.JobTimeoutError):
        cluster4.run(reduce_scatter_against_all_reduce, timeout=6)
    text = str(ppkit.collective_doctor(cluster4))
    assert "collective #1 does not match: the op differs" in text, text
    assert "ranks 2-3: all_reduce #1 of [2] Float" in text and "reduce_scatter (gloo records all_reduce #1-#4)" in text


def forty_irecvs_one_unmatched(i, port):
    """Rank 0 posts 40 irecvs (tags 0-39) and waits on each in order; rank 1 sends tags 1-39 only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    bufs = [torch.zeros(4) for _ in range(40)]
    if i == 0:
        for req in [dist.irecv(bufs[k], src=1, tag=k) for k in range(40)]:
            req.wait()
    else:
        [dist.isend(bufs[k], dst=0, tag=k) for k in range(1, 40)]
    dist.barrier()


def subgroups_in_a_different_order(i, port):
    """Rank 2 creates new_group([1, 2]) before new_group([0, 1]); ranks 0 and 1 the other way round.
    Group names come from a counter, so the ranks disagree on which ranks group 1 holds."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=3)
    if i == 2:
        b, _ = dist.new_group([1, 2]), dist.new_group([0, 1])
    else:
        _, b = dist.new_group([0, 1]), dist.new_group([1, 2])
    if i in (1, 2):
        dist.all_reduce(torch.ones(2), group=b)
    dist.barrier()


def what_a_hang_says(capsys, program, nprocs: int) -> str:
    with pytest.raises(ppkit.JobTimeoutError):
        ppkit.spawn(program, args=(free_port(),), nprocs=nprocs, timeout=8)
    return capsys.readouterr().out


def test_a_rank_waiting_on_its_oldest_irecv_among_forty_is_said_to_wait_there(capsys):
    out = what_a_hang_says(capsys, forty_irecvs_one_unmatched, 2)
    assert "rank 0 waits in irecv from rank 1 of [4] float32" in out, out  # tag 0, the default, goes unnamed
    assert "own code" not in out, out


def test_ranks_that_disagree_on_a_groups_members_are_named_and_none_is_in_its_own_code(capsys):
    out = what_a_hang_says(capsys, subgroups_in_a_different_order, 3)
    assert "own code" not in out, out
    assert "inside torch.distributed (new_group" in out, out
    assert "the ranks disagree on the members of group 1: ranks 0-1 say [0, 1], rank 2 says [1, 2]" in out, out


def funcol_against_recv(i, port):
    """funcol's all_reduce reaches the backend from C++: no record of the learner's call, only where the rank
    waits (reading the result, a line below the call)."""
    import torch.distributed._functional_collectives as funcol

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    if i == 0:
        y = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
        print(y.sum().item())
    else:
        dist.recv(torch.zeros(1), src=0)


def test_a_call_without_its_own_line_is_said_to_wait_at_the_ranks_line_not_called_there(capsys):
    out = what_a_hang_says(capsys, funcol_against_recv, 2)
    assert "rank 0: all_reduce #1 of [2] Float, its rank waits at test_doctor_review.py" in out, out
    assert "print(y.sum().item())" in out and "called at test_doctor_review.py, line" not in out.split(
        "rank 0: all_reduce #1")[1].splitlines()[0], out


def three_thousand_all_reduces(i, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    t = torch.ones(1)
    for _ in range(3000):
        dist.all_reduce(t)
    print(f"rank {i} done", flush=True)


def test_a_loop_of_collectives_that_moves_is_not_called_hung_on_real_ranks(monkeypatch, capsys):
    """The record moves between the watch's two looks (a real-rank version of the hand-made records of
    test_doctor_records.py::test_a_record_that_moves_between_two_looks_is_not_hung)."""
    monkeypatch.setenv("PPKIT_HANG_S", "0.5")
    ppkit.spawn(three_thousand_all_reduces, args=(free_port(),), nprocs=2, timeout=120)
    out = capsys.readouterr().out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    assert "possibly hung" not in out, out
