"""The collective doctor (issue 47) as a learner meets it: in a real Jupyter kernel, each kind of
disagreement between ranks is named in the cell, by ppkit.spawn (hang watch after PPKIT_HANG_S=2 s,
then its timeout), by %%ranks --timeout, and on demand with ppkit.collective_doctor(cluster).

One kernel serves every case (kernel and fork server cost seconds to start); each case is one short cell.
"""

from __future__ import annotations

import dataclasses

import pytest
from kernels import kernel_in
from test_debugger import run_cell
from test_layout import payload_problems

from ppkit.cluster.hang_doctor import diagnose
from ppkit.transport import flight_messages

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

START = """
import os, time
import torch, torch.distributed as dist
import ppkit
from ppkit.lessons.data_parallel import free_port
%load_ext ppkit

def join(i):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["DOCTOR_PORT"])
    dist.init_process_group("gloo", rank=i, world_size=2)

def spawn(fn):
    os.environ["DOCTOR_PORT"] = str(free_port())
    try:
        ppkit.spawn(fn, nprocs=2, timeout=9)
    except ppkit.WorkerError as exc:
        print(type(exc).__name__, exc)
print("ready")
"""


@pytest.fixture(scope="module")
def kc(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:  # the kernel inherits this environment
        env.setenv("PPKIT_HANG_S", "2")
        with kernel_in(tmp_path_factory.mktemp("doctor"), expect_processes=True) as (_, client):
            cell = run_cell(client, START)
            assert cell.error is None and "ready" in cell.text, cell.text
            yield client


def spawned(kc, body: str):
    """The cell's text after ``spawn(case)`` of a ``case(i)`` whose body is ``body`` (after join(i))."""
    cell = run_cell(kc, "def case(i):\n    join(i)\n" + "".join(f"    {line}\n" for line in body.splitlines())
                    + "spawn(case)\n")
    assert cell.error is None, cell.text
    return cell.text


def test_an_op_mismatch_names_both_ops_their_sizes_and_lines(kc):
    text = spawned(kc, "t = torch.ones(4)\ndist.all_reduce(t)\n"
                       "dist.all_reduce(t) if i == 0 else dist.broadcast(t, src=0)")
    assert "possibly hung" in text, text
    assert "every rank that answered completed collective #1 (all_reduce)" in text, text
    assert "collective #2 does not match: the op differs" in text, text
    assert "rank 0: all_reduce #2 of [4] Float" in text and "rank 1: broadcast #2 of [4] Float" in text, text
    assert "dist.all_reduce(t) if i == 0 else dist.broadcast(t, src=0)" in text, text  # the learner's line


def test_a_skipped_collective_is_named_against_the_barrier(kc):
    text = spawned(kc, "t = torch.ones(4)\nif i == 0:\n    dist.all_reduce(t)\ndist.barrier()")
    assert "collective #1 does not match: the op differs" in text, text
    assert "rank 0: all_reduce #1 of [4] Float" in text and "rank 1: barrier #1" in text, text
    assert "one rank skipped a collective" in text, text


def test_different_sizes_are_named_after_gloo_aborts_a_rank(kc):
    text = spawned(kc, "dist.all_reduce(torch.ones(4 if i == 0 else 8))")
    assert "collective #1 does not match: the sizes differ" in text, text
    assert "all_reduce #1 of [4] Float" in text and "all_reduce #1 of [8] Float" in text, text


def test_different_process_groups_are_named(kc):
    text = spawned(kc, "group = dist.new_group([0, 1])\nt = torch.ones(2)\n"
                       "dist.all_reduce(t, group=group if i == 0 else None)")
    assert "the ranks wait in different process groups" in text, text
    assert "rank 1 has not reached it: it waits in all_reduce #1 of group 0" in text, text
    assert "rank 0 has not reached it: it waits in all_reduce #1 of group 1" in text, text


def test_a_send_recv_pair_that_waits_on_each_other_names_each_peer(kc):
    text = spawned(kc, "t = torch.zeros(3)\ndist.recv(t, src=1 - i)")
    assert "rank 0 waits in recv from rank 1 of [3] float32" in text, text
    assert "rank 1 waits in recv from rank 0 of [3] float32" in text, text
    assert "ranks 0 and 1 each wait on the other" in text, text


def test_an_irecv_pair_that_waits_on_each_other_names_each_peer(kc):
    """gloo keeps no record of send/recv, and the innermost frame is the learner's req.wait(): ppkit's own p2p ring."""
    text = spawned(kc, "t = torch.zeros(3)\nreq = dist.irecv(t, src=1 - i)\nreq.wait()")
    assert "possibly hung" in text, text
    assert "rank 0 waits in irecv from rank 1 of [3] float32" in text, text
    assert "rank 1 waits in irecv from rank 0 of [3] float32" in text, text
    assert "ranks 0 and 1 each wait on the other" in text, text
    assert "req = dist.irecv(t, src=1 - i)" in text, text  # the learner's line that started it


def test_a_rank_that_ended_early_is_named(kc):
    text = spawned(kc, "t = torch.ones(4)\ndist.all_reduce(t)\nif i == 0:\n    dist.all_reduce(t)")
    assert "collective #2 is not reached by every rank" in text, text
    assert "rank 1 has not reached it: it finished its job and its process ended" in text, text
    assert "does not match" not in text, text


def test_a_rank_that_computes_for_a_while_is_no_false_alarm(kc):
    text = spawned(kc, "t = torch.ones(4)\nif i == 1:\n    time.sleep(5)\ndist.all_reduce(t)\n"
                       "print('sum', t[0].item())")
    assert "[rank 0] sum 2.0" in text and "[rank 1] sum 2.0" in text, text
    assert "does not match" not in text and "possibly hung" not in text and "collective doctor" not in text, text


def test_ranks_cell_that_times_out_names_the_mismatch_and_the_doctor_answers_on_demand(kc):
    assert run_cell(kc, "cluster = ppkit.start(2)").error is None
    cell = run_cell(kc, "%%ranks --timeout 6\nt = torch.ones(4)\n"
                        "dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0)\n")
    assert cell.error is not None and cell.error[0] == "JobTimeoutError", cell.text
    assert "rank 0: all_reduce #1 of [4] Float" in cell.text and "rank 1: broadcast #1 of [4] Float" in cell.text
    again = run_cell(kc, "print(ppkit.collective_doctor())")  # the ranks still wait: their reader threads answer
    assert again.error is None, again.text
    assert "does not match: the op differs" in again.text, again.text
    assert run_cell(kc, "cluster.close()").error is None


def test_the_flight_record_messages_are_typed_frozen_dataclasses():
    classes = [c for c in vars(flight_messages).values()
               if isinstance(c, type) and c.__module__ == flight_messages.__name__]
    assert len(classes) == 2 and all(dataclasses.is_dataclass(c) for c in classes)
    assert [p for c in classes for p in payload_problems(c, flight_messages)] == []


def test_a_record_that_matches_on_every_rank_is_no_problem():
    call = {"group": "0", "desc": "default_pg", "seq": 1, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
            "profiling_name": "gloo:all_reduce", "input_sizes": [[4]], "output_sizes": [[4]],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled", "done": False,
            "time_created_ns": 1, "at": {}}
    record = {"calls": [call], "groups": {"0": {"desc": "default_pg", "ranks": [0, 1]}}, "p2p": None}
    diagnosis = diagnose({0: record, 1: record}, 2)
    assert not diagnosis.problem
    assert "collective #1 is called by every rank and has not completed yet" in str(diagnosis)
    other = {**record, "calls": [{**call, "op": "broadcast", "profiling_name": "gloo:broadcast"}]}
    assert diagnose({0: record, 1: other}, 2).mismatched[0].mismatch == "the op differs"


def test_a_mismatch_that_completed_on_every_rank_is_still_named():
    """NCCL (and gloo, for some pairs) may pair unlike calls and finish them: the record still shows the mismatch."""
    call = {"group": "0", "desc": "default_pg", "seq": 1, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
            "profiling_name": "gloo:all_reduce", "input_sizes": [[]], "output_sizes": [[]],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled", "done": True,
            "time_created_ns": 1, "at": {}}
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1]}}
    rank0 = {"calls": [call, {**call, "seq": 2}], "groups": groups, "p2p": None}
    rank1 = {"calls": [{**call, "input_sizes": [[3]], "output_sizes": [[3]]}], "groups": groups, "p2p": None}
    diagnosis = diagnose({0: rank0, 1: rank1}, 2)
    assert diagnosis.problem and diagnosis.mismatched[0].seq == 1
    assert "collective #1 does not match: the sizes differ" in str(diagnosis)
    assert "it completed on every rank anyway" in str(diagnosis)


def test_a_torchrun_cell_names_the_mismatch(kc):
    cell = run_cell(kc, "%%torchrun --nproc-per-node 2 --timeout 9\nimport torch, torch.distributed as dist\n"
                        "dist.init_process_group('gloo')\nt = torch.ones(4)\n"
                        "dist.all_reduce(t) if dist.get_rank() == 0 else dist.broadcast(t, src=0)\n")
    text = cell.text + str(cell.error)
    assert "collective #1 does not match: the op differs" in text, text
    assert "rank 0: all_reduce #1 of [4] Float" in text and "rank 1: broadcast #1 of [4] Float" in text, text


def test_a_torchrun_cells_overlap_is_not_called_hung(kc):
    """isend, compute, recv, wait in a %%torchrun cell: the main threads sleep in the cell's own code
    (``<%%torchrun cell N>``) while each isend is pending, past the watch's 2 s."""
    cell = run_cell(kc, "%%torchrun --nproc-per-node 2 --timeout 40\nimport time, torch, torch.distributed as dist\n"
                        "dist.init_process_group('gloo')\nrank = dist.get_rank()\n"
                        "req = dist.isend(torch.full((3,), float(rank)), dst=1 - rank)\ntime.sleep(6)\n"
                        "got = torch.zeros(3)\ndist.recv(got, src=1 - rank)\nreq.wait()\n"
                        "print('received', got.tolist() == [1.0 - rank] * 3)\n")
    assert cell.error is None, cell.text
    assert "received True" in cell.text and "False" not in cell.text, cell.text
    assert "possibly hung" not in cell.text and "each wait on the other" not in cell.text, cell.text


def test_the_doctor_on_demand_says_what_to_do_without_a_cluster():
    import ppkit
    from ppkit.cluster import session
    from ppkit.cluster.hang_doctor import on_demand

    if session.active() is None and on_demand.last_run() is None:  # a failed ppkit.spawn run's reading comes back
        with pytest.raises(ppkit.ClusterStateError, match=r"no %%ranks cell has started one"):
            ppkit.collective_doctor()
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=30) as cluster:
        assert not ppkit.collective_doctor(cluster).problem  # no process group: nothing recorded, nothing wrong
    with pytest.raises(ppkit.ClusterStateError, match="it is closed"):
        ppkit.collective_doctor(cluster)


def test_a_recorder_turned_off_and_an_unreadable_record_are_said():
    from ppkit.cluster.hang_doctor import parse

    assert parse("not json")["error"].startswith("unreadable record")
    diagnosis = diagnose({0: {"buffer": 0, "calls": [], "groups": {}, "p2p": None}}, 2)
    text = str(diagnosis)
    assert "rank(s) [0] record nothing: TORCH_FR_BUFFER_SIZE=0" in text and "rank(s) [1] sent no record" in text


def three_all_reduces(rank, world_size):
    import os

    import torch
    import torch.distributed as dist

    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    return os.environ.get("TORCH_FR_BUFFER_SIZE")


def test_every_rank_records_unless_the_learner_chose_a_size():
    """torch 2.14 records every process group's collectives by default (2000 entries), gloo's too: ppkit
    sets nothing, and the record holds the calls; TORCH_FR_BUFFER_SIZE=0 turns it off."""
    import ppkit

    with ppkit.Cluster(2, "gloo", timeout=30) as cluster:
        assert cluster.run(three_all_reduces) == [None, None]  # torch's default, not a size of ppkit's
        records = ppkit.collective_doctor(cluster).records
        assert [len([c for c in records[r]["calls"] if c["op"] == "all_reduce"]) for r in (0, 1)] == [3, 3], records
        assert {records[r]["buffer"] for r in (0, 1)} == {2000}
    with ppkit.Cluster(2, "gloo", timeout=30, env={"TORCH_FR_BUFFER_SIZE": "0"}) as cluster:
        assert cluster.run(three_all_reduces) == ["0", "0"]
        diagnosis = ppkit.collective_doctor(cluster)
        assert [diagnosis.records[r]["calls"] for r in (0, 1)] == [[], []]
        assert "record nothing: TORCH_FR_BUFFER_SIZE=0" in str(diagnosis)


def test_the_hang_rule_counts_a_collective_started_and_not_completed():
    """NCCL's wait is at .item() or synchronize, in the learner's own code: only the record shows the wait."""
    from ppkit.cluster.hang_watch import HangWatch

    at_item = '  File "/tmp/ipykernel_1/2.py", line 7, in train\n    print(t.sum().item())\n'
    started = {"calls": [{"group": "0", "seq": 2, "done": False, "is_p2p": False}], "p2p": None}
    finished = {"calls": [{"group": "0", "seq": 2, "done": True, "is_p2p": False}], "p2p": None}
    assert HangWatch(60).look({0: at_item}, {0: finished}) is None  # computing: no alarm
    assert HangWatch(60).look({0: at_item}) is None
    watch = HangWatch(60)
    assert watch.look({0: at_item}, {0: started}) is None  # a first look only notes what it saw
    assert watch.look({0: at_item}, {0: started}).startswith("[ppkit] possibly hung")  # the same again: hung
