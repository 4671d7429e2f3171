"""What the collective doctor may say, on real gloo ranks outside a kernel: correct overlap is no
deadlock, a destroyed group's record does not stand in for its successor's, a completed difference is
a note and the doctor goes on to the hang, more than KEEP calls in flight, the learner's API call and
its reduce op, p2p wait cycles and tags, and two backends under one group name.
tests/test_hang_doctor.py covers the cases as a learner meets them in a kernel.
"""

from __future__ import annotations

import json
import os
import pickle
import time

import pytest
import torch
import torch.distributed as dist
from test_spawn import assert_none_left

import ppkit
from ppkit.cluster.hang_doctor import diagnose
from ppkit.cluster.hang_watch import HangWatch
from ppkit.lessons.data_parallel import free_port

pytestmark = pytest.mark.timeout(300)


def join(i, port, world_size=2):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=world_size)


def isend_compute_recv(i, port):
    """Each rank starts its send, computes, then receives: correct code, whatever the look sees."""
    join(i, port)
    out, got = torch.full((3,), float(i)), torch.zeros(3)
    req = dist.isend(out, dst=1 - i)
    time.sleep(6)
    dist.recv(got, src=1 - i)
    req.wait()
    print(f"rank {i} got {got[0].item()}", flush=True)


def async_all_reduces_on_two_groups(i, port):
    """Each rank starts an all_reduce on one group, computes, then starts one on the other: it
    waits on both only at the end. Correct: each group's call is matched once both ranks start it."""
    join(i, port)
    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    first, second = (groups[0], groups[1]) if i == 0 else (groups[1], groups[0])
    a, b = torch.ones(2), torch.ones(2)
    work_a = dist.all_reduce(a, group=first, async_op=True)
    time.sleep(6)
    work_b = dist.all_reduce(b, group=second, async_op=True)
    work_a.wait()
    work_b.wait()
    print(f"rank {i} sums {a[0].item()} {b[0].item()}", flush=True)


def async_all_reduces_with_a_library_computing_between(i, port, compute):
    """The same overlap, with the compute inside torch.nn (a Linear's forward) or autograd (backward): the
    main thread's innermost frame is the library's while each rank's first all_reduce is pending (review
    52b, cases D1m, D1, D2)."""
    join(i, port)
    torch.set_num_threads(1)
    groups = [dist.new_group([0, 1]), dist.new_group([0, 1])]
    first, second = (groups[0], groups[1]) if i == 0 else (groups[1], groups[0])
    linear, x = torch.nn.Linear(1000, 1000), torch.randn(200, 1000)
    a, b = torch.ones(2), torch.ones(2)
    work_a = dist.all_reduce(a, group=first, async_op=True)
    began = time.monotonic()
    while time.monotonic() - began < 7:
        if compute == "forward":
            with torch.no_grad():
                linear(x)
        else:
            linear(x).sum().backward()
    work_b = dist.all_reduce(b, group=second, async_op=True)
    work_a.wait()
    work_b.wait()
    print(f"rank {i} sums {a[0].item()} {b[0].item()}", flush=True)


def linear_forward_between(i, port):
    async_all_reduces_with_a_library_computing_between(i, port, "forward")


def backward_between(i, port):
    async_all_reduces_with_a_library_computing_between(i, port, "backward")


@pytest.mark.parametrize("program", [isend_compute_recv, async_all_reduces_on_two_groups, linear_forward_between,
                                     backward_between])
def test_a_valid_overlap_program_is_not_called_hung(monkeypatch, capsys, program):
    monkeypatch.setenv("PPKIT_HANG_S", "2")
    ppkit.spawn(program, args=(free_port(),), nprocs=2, timeout=60)
    out = capsys.readouterr().out
    assert "[rank 0]" in out and "[rank 1]" in out, out
    assert "possibly hung" not in out and "each wait on the other" not in out, out
    assert "different process groups" not in out, out
    assert_none_left()


def test_a_record_that_moves_between_two_looks_is_not_hung():
    """Every rank's stack is inside torch.distributed at each look, but the record moved in between."""
    stack = '  File "/x/torch/distributed/distributed_c10d.py", line 3, in all_reduce\n    work.wait()\n'

    def at(seq):
        call = {"group": "0", "seq": seq, "done": False, "is_p2p": False, "backend": "gloo"}
        return {"calls": [{**call, "seq": seq - 1, "done": True}, call], "p2p": None, "main": "distributed"}

    watch = HangWatch(2)
    assert watch.look({0: stack, 1: stack}, {0: at(2945), 1: at(2945)}) is None  # the first look only notes
    assert watch.look({0: stack, 1: stack}, {0: at(2950), 1: at(2950)}) is None  # it moved: not hung
    message = watch.look({0: stack, 1: stack}, {0: at(2950), 1: at(2950)})  # the same twice: hung
    assert message and message.startswith("[ppkit] possibly hung"), message


def test_a_wait_that_only_the_record_shows_is_not_a_hang_while_the_rank_is_in_its_own_code():
    own = '  File "/tmp/ipykernel_1/2.py", line 7, in train\n    time.sleep(12)\n'
    pending = {"calls": [{"group": "0", "seq": 2, "done": False, "is_p2p": False, "backend": "gloo"}],
               "p2p": None, "main": "own"}
    watch = HangWatch(2)
    assert watch.look({0: own, 1: own}, {0: pending, 1: pending}) is None
    assert watch.look({0: own, 1: own}, {0: pending, 1: pending}) is None  # gloo's record alone: never a hang


def test_a_rank_in_a_library_is_waiting_only_while_its_main_thread_uses_no_cpu_time():
    """Inside torch.nn with a gloo call pending: DDP's reducer blocked in C++ uses no CPU time, a Linear's
    forward does. The frames read the same at both looks; the CPU time tells them apart."""
    in_linear = '  File "/x/torch/nn/modules/linear.py", line 134, in forward\n    return F.linear(x)\n'

    def record(main, cpu_s, cpu_at):
        return {"calls": [{"group": "1", "seq": 1, "done": False, "is_p2p": False, "backend": "gloo"}],
                "p2p": None, "main": main, "cpu_s": cpu_s, "cpu_at": cpu_at}

    computing = HangWatch(2)
    assert computing.look({0: in_linear}, {0: record("other", 10.0, 100.0)}) is None
    assert computing.look({0: in_linear}, {0: record("other", 12.5, 103.0)}) is None  # 2.5 s of CPU in 3 s
    assert computing.look({0: in_linear}, {0: record("busy", 15.0, 106.0)}) is None  # its record says so itself
    assert computing.look({0: in_linear}, {0: record("busy", 15.0, 109.0)}) is None
    blocked = HangWatch(2)
    assert blocked.look({0: in_linear}, {0: record("other", 10.0, 100.0)}) is None
    message = blocked.look({0: in_linear}, {0: record("other", 10.0, 103.0)})
    assert message and message.startswith("[ppkit] possibly hung"), message


def all_reduces(rank, world_size, port, count):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    for _ in range(count):
        dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()


def rank_one_never_reaches(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if rank == 0:
        dist.all_reduce(torch.ones(2))  # rank 1 returns: this waits
    return rank


def test_a_destroyed_groups_record_does_not_hide_a_hang_in_its_successor():
    """Notebook 03's persistent workers: job 1's group (name 0, seq 1-30) is destroyed; job 2's new
    group has the same name and counts from 1 again."""
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        cluster.run(all_reduces, free_port(), 30)
        with pytest.raises(ppkit.JobTimeoutError):
            cluster.run(rank_one_never_reaches, free_port(), timeout=6)
        text = str(ppkit.collective_doctor(cluster))
    assert "every collective each rank started has completed" not in text, text
    assert "no collective completed on every rank yet" in text, text
    assert "collective #1 is not reached by every rank" in text, text
    assert "rank 1 has not reached it" in text, text


def shapes_then_a_hang(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.arange(4.0) if rank == 0 else torch.arange(4.0).reshape(2, 2)
    dist.all_reduce(t)  # 4 elements against 2x2: completes, with the right sums
    if t.flatten().tolist() != [0.0, 2.0, 4.0, 6.0]:
        raise AssertionError(t)
    if rank == 0:
        dist.all_reduce(torch.ones(2))


def test_a_completed_difference_is_a_note_and_the_doctor_goes_on_to_the_hang():
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        with pytest.raises(ppkit.JobTimeoutError):
            cluster.run(shapes_then_a_hang, free_port(), timeout=6)
        text = str(ppkit.collective_doctor(cluster))
    assert "the data it moved is wrong" not in text, text
    assert "collective #1" in text and "[4]" in text and "[2, 2]" in text, text  # the note
    assert "completed collective #1 (all_reduce)" in text, text
    assert "collective #2 is not reached by every rank" in text and "rank 1 has not reached it" in text, text


def all_gather_of_uneven_inputs(i, port, first_all_reduce):
    join(i, port)
    if first_all_reduce:
        dist.all_reduce(torch.ones(1))
    out = [torch.zeros(3), torch.zeros(3)]
    dist.all_gather(out, torch.ones(3 if i == 0 else 2))  # gloo raises on rank 1 before it runs the call


@pytest.mark.parametrize("first_all_reduce", [False, True])
def test_a_rank_whose_call_raised_before_the_backend_ran_it_is_said_to_have_raised_in_it(capsys, first_all_reduce):
    """Review 52b, case D25: rank 1 raised inside all_gather (gloo's "invalid tensor size"), so its record
    holds no entry for it; it made the call, and the sizes differ. Its earlier all_reduce completed."""
    with pytest.raises(ppkit.ProcessRaisedError):
        ppkit.spawn(all_gather_of_uneven_inputs, args=(free_port(), first_all_reduce), nprocs=2, timeout=30)
    out = capsys.readouterr().out
    seq = 2 if first_all_reduce else 1
    assert "has not reached it" not in out, out
    assert f"collective #{seq} does not match: the sizes differ" in out, out
    assert f"rank 0: all_gather #{seq} of [3] Float" in out, out
    assert (f"rank 1: all_gather #{seq} of [2] Float, called at test_doctor_records.py, line " in out
            and "it raised in this call before gloo ran it: RuntimeError: ProcessGroupGloo::allgather: invalid "
                "tensor size" in out), out
    if first_all_reduce:
        assert "every rank that answered completed collective #1 (all_reduce)" in out, out
    assert_none_left()


def twenty_in_flight_against_a_recv(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    if rank == 0:
        works = [dist.all_reduce(torch.ones(2), async_op=True) for _ in range(20)]
        for work in works:
            work.wait()
    else:
        dist.recv(torch.zeros(1), src=0)


def test_more_than_sixteen_collectives_in_flight():
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        with pytest.raises(ppkit.JobTimeoutError):
            cluster.run(twenty_in_flight_against_a_recv, free_port(), timeout=6)
        text = str(ppkit.collective_doctor(cluster))
    assert "every rank that answered completed collective #3 (all_reduce)" in text, text
    assert "collective #4 is not reached by every rank" in text, text
    assert "rank 0: all_reduce #4 of [2] Float" in text, text
    assert "rank 1 has not reached it: it waits in recv from rank 0" in text, text
    assert "rank 0 has not reached" not in text, text


def reduce_scatters_then_a_hang(rank, world_size, port, tensor_form):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if rank == 0:
        if tensor_form:
            dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(4))
        else:
            dist.reduce_scatter(torch.zeros(2), [torch.ones(2), torch.ones(2)])


@pytest.mark.parametrize("tensor_form", [False, True])
def test_the_learners_call_is_named_beside_the_backends_op(tensor_form):
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        with pytest.raises(ppkit.JobTimeoutError):
            cluster.run(reduce_scatters_then_a_hang, free_port(), tensor_form, timeout=6)
        text = str(ppkit.collective_doctor(cluster))
    called = "reduce_scatter_tensor" if tensor_form else "reduce_scatter"
    assert f"rank 0: {called} (gloo records all_reduce #1" in text, text
    assert ("dist.reduce_scatter_tensor(" if tensor_form else "dist.reduce_scatter(torch.zeros(2)") in text, text
    if not tensor_form:
        assert "all_reduce #1-#2" in text, text  # the list form: one all_reduce per rank's piece
    assert "count the calls gloo recorded" in text, text


def send_ring(i, port):
    join(i, port, 3)
    dist.send(torch.ones(1 << 16), dst=(i + 1) % 3)  # large: gloo's send waits for its receiver
    dist.recv(torch.zeros(1 << 16), src=(i + 2) % 3)


def mismatched_tags(i, port):
    join(i, port)
    t = torch.ones(1 << 16)
    req = dist.isend(t, dst=1, tag=1) if i == 0 else dist.irecv(t, src=0, tag=2)
    req.wait()


def what_a_hang_says(capsys, program, nprocs: int) -> str:
    """The cell's output when ``program`` hangs until spawn's timeout, its doctor's words included."""
    with pytest.raises(ppkit.JobTimeoutError):
        ppkit.spawn(program, args=(free_port(),), nprocs=nprocs, timeout=8)
    assert_none_left()
    return capsys.readouterr().out


def test_a_three_rank_send_ring_is_named_as_a_cycle(capsys):
    out = what_a_hang_says(capsys, send_ring, 3)
    assert "ranks 0, 1, 2 wait in a cycle" in out, out
    assert "rank 0's send waits on rank 1, in send to rank 2" in out, out


def test_a_tag_mismatch_is_named(capsys):
    out = what_a_hang_says(capsys, mismatched_tags, 2)
    assert "the tags differ: rank 0's isend to rank 1 has tag 1, rank 1's irecv from rank 0 has tag 2" in out, out


def each_rank_its_own_root(i, port):
    join(i, port)
    dist.broadcast(torch.full((4,), float(i)), src=i)


def test_a_root_mismatch_is_named(capsys):
    out = what_a_hang_says(capsys, each_rank_its_own_root, 2)
    assert "collective #1 does not match: the root differs" in out, out
    assert "rank 0: broadcast #1 of [4] Float, root rank 0" in out, out
    assert "rank 1: broadcast #1 of [4] Float, root rank 1" in out, out


def sum_against_max(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    return t.item()


def test_a_reduce_op_mismatch_is_named():
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        cluster.run(sum_against_max, free_port())
        diagnosis = ppkit.collective_doctor(cluster)
    text = str(diagnosis)
    assert diagnosis.problem, text
    assert "collective #1 does not match: the reduce op differs" in text, text
    assert "all_reduce #1 of [1] Float, SUM" in text and "all_reduce #1 of [1] Float, MAX" in text, text


def _entry(backend, seq, pg_id, done, op="all_reduce", sizes=((4,),)):
    return {"record_id": seq, "pg_id": pg_id, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"{backend}:{op}", "time_created_ns": seq * 10
            + (1 if backend == "gloo" else 0), "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"],
            "output_sizes": [list(s) for s in sizes], "output_dtypes": ["Float"], "state": "completed" if done
            else "scheduled", "retired": done, "is_p2p": False}


def test_two_backends_under_one_group_name_keep_their_own_records(monkeypatch):
    """'cpu:gloo,cuda:nccl': gloo's and NCCL's recorders each count from 1 under group 0. Built as
    flight_record reads them (torch's two dumps), since this machine has no GPU."""
    from torch._C import _distributed_c10d as c10d

    from ppkit.transport import flight_record

    def record(rank):
        gloo = [_entry("gloo", 1, 0, True), _entry("gloo", 2, 0, True)]
        nccl = [_entry("nccl", 1, 1, True), _entry("nccl", 2, 1, False, sizes=((8,),) if rank else ((4,),))]
        monkeypatch.setattr(c10d, "_dump_fr_trace", lambda **_: pickle.dumps({"entries": gloo}), raising=False)
        monkeypatch.setattr(c10d, "_dump_nccl_trace", lambda **_: pickle.dumps({"entries": nccl}), raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        return {**json.loads(flight_record.snapshot(None)), "groups": {"0": {"desc": "default_pg", "ranks": [0, 1]}}}

    records = {0: record(0), 1: record(1)}
    assert len(records[0]["calls"]) == 4, records[0]["calls"]
    diagnosis = diagnose(records, 2)
    text = str(diagnosis)
    assert [(g.name, g.backend, g.seq) for g in diagnosis.mismatched] == [("0", "nccl", 2)], text
    assert "group 0 (nccl, the default group, ranks [0, 1])" in text, text
    assert "group 0 (gloo" not in text, text  # gloo's calls all completed and match


def test_a_rank_between_jobs_is_idle_not_computing_or_waiting():
    """A job that returned with an async all_reduce pending, each rank in its own group: asked
    afterwards, no rank waits anywhere, and none computes."""
    def pending(group):
        return {"group": group, "desc": "undefined", "seq": 1, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
                "backend": "gloo", "profiling_name": "gloo:all_reduce", "input_sizes": [[2]], "output_sizes": [[2]],
                "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled", "done": False,
                "time_created_ns": 1, "at": {}}

    groups = {"1": {"desc": "undefined", "ranks": [0, 1]}, "2": {"desc": "undefined", "ranks": [0, 1]}}
    records = {r: {"calls": [pending(str(r + 1))], "groups": groups, "p2p": None, "main": "idle"} for r in (0, 1)}
    text = str(diagnose(records, 2))
    assert "rank 1 has not reached it: its job returned, so it is idle; it started all_reduce #1 of group 2" in text
    assert "different process groups" not in text and "own code" not in text, text


def dtypes_differ(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64))


def test_a_rank_that_died_in_the_call_is_not_said_on_demand_to_have_not_reached_it():
    """gloo aborts a rank inside a dtype mismatch (SIGABRT): on demand, that rank sends no record, so whether
    it made the call is not known; the doctor must not say it "has not reached it"."""
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        with pytest.raises(ppkit.WorkerError):
            cluster.run(dtypes_differ, free_port(), timeout=10)
        text = str(ppkit.collective_doctor(cluster))
    assert "has not reached it" not in text, text
    assert "no record" in text and "is not known" in text, text


def test_a_subgroup_whose_members_no_record_lists_is_not_given_the_whole_world():
    """The corpus's subgroup_then_world_skip: ranks 0-1 ended without listing group 2 (new_group([2, 3])); the
    doctor took every rank as its member and said ranks 0-1 had not reached its all_reduce."""
    from ppkit.cluster.hang_doctor.memberships import memberships

    call = {"group": "2", "desc": "undefined"}
    records = {0: {"calls": [{"group": "0"}]}, 1: {"calls": [{"group": "0"}]},
               2: {"calls": [{"group": "0"}, call]}, 3: {"calls": [{"group": "0"}, call]}}
    groups = memberships(records, 4)
    assert groups["2"][1] == [2, 3] and groups["0"][1] == [0, 1, 2, 3], groups


def p2p_between_two_ranks_then_collectives(rank, world_size, port):
    """Correct: ranks 0 and 1 exchange by send/recv between the world's collectives (the pattern of
    ppkit.bench's p2p row); then rank 0 alone calls an all_reduce. gloo counts the send/recv in its
    sequence number and not in the record's collective count."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
    dist.broadcast(t, src=0)
    dist.all_gather_into_tensor(torch.empty(4 * world_size), t)
    if rank == 0:
        dist.all_reduce(torch.ones(2))


def test_send_and_recv_on_some_ranks_do_not_shift_the_names_of_later_collectives():
    with ppkit.Cluster(4, "gloo", process_group=False, timeout=60) as cluster:
        with pytest.raises(ppkit.JobTimeoutError):
            cluster.run(p2p_between_two_ranks_then_collectives, free_port(), timeout=6)
        diagnosis = ppkit.collective_doctor(cluster)
    text = str(diagnosis)
    assert "does not match" not in text, text
    assert "every rank that answered completed collective #3 (all_gather)" in text, text
    assert "rank 0: all_reduce #4 of [2] Float, SUM" in text, text
    calls = {rank: call["api"] for finding in diagnosis.groups for rank, call in finding.calls.items()}
    assert calls.get(0) == "all_reduce", calls


def recv_from_the_wrong_rank(rank, port):
    """Rank 0 sends to rank 1; rank 1 receives from rank 2, which returns without sending."""
    join(rank, port, 3)
    t = torch.zeros(2)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=2)


def returns_before_its_send(rank, port):
    join(rank, port)
    if rank == 1:
        dist.recv(torch.zeros(2), src=0)


def sends_four_receives_three(rank, port):
    join(rank, port)
    if rank == 0:
        dist.send(torch.ones(4), dst=1)
    else:
        dist.recv(torch.zeros(3), src=0)


def ping_pong_then_return(rank, port):
    join(rank, port)
    t = torch.zeros(3)
    for _ in range(3):
        if rank == 0:
            dist.send(t + 1, dst=1)
            dist.recv(t, src=1)
        else:
            dist.recv(t, src=0)
            dist.send(t + 1, dst=0)
    if rank == 0:
        dist.all_reduce(t)  # rank 1 has returned: a hang, whose doctor reads the completed send/recv too


def what_a_failed_spawn_read(program, nprocs: int):
    with pytest.raises(ppkit.WorkerError) as caught:
        ppkit.spawn(program, args=(free_port(),), nprocs=nprocs, timeout=8)
    assert_none_left()
    assert caught.value.diagnosis is not None, caught.value
    return caught.value.diagnosis


def test_a_recv_from_a_rank_that_never_sends_while_another_sends_names_the_receivers_peer():
    diagnosis = what_a_failed_spawn_read(recv_from_the_wrong_rank, 3)
    text = str(diagnosis)
    assert diagnosis.unmatched == [(1,)], text  # rank 0's send is not named: rank 1, its receiver, failed first
    assert "rank 1's irecv #1 from rank 2 (tag 0) of [2] float32 (8 bytes)" in text, text
    assert "rank 2 ended (it finished its job and its process ended) having posted 0 send(s) to rank 1" in text, text
    assert "with src=0 instead of src=2, rank 1's call would be paired with it" in text, text


def test_a_recv_whose_sender_returned_names_the_sender_and_says_either_could_be_wrong():
    diagnosis = what_a_failed_spawn_read(returns_before_its_send, 2)
    text = str(diagnosis)
    assert diagnosis.unmatched == [(0,)], text
    assert "Either rank 0 returned before its send to rank 1, or rank 1 should not receive from it" in text, text


def batch_without_its_send(rank, port):
    """Review 52b, case D4: rank 0 batches a send to rank 1 and a recv from it; rank 1 batches only its recv."""
    join(rank, port)
    ops = ([dist.P2POp(dist.isend, torch.ones(3), 1), dist.P2POp(dist.irecv, torch.zeros(3), 1)] if rank == 0
           else [dist.P2POp(dist.irecv, torch.zeros(3), 0)])
    for req in dist.batch_isend_irecv(ops):  # gloo: no coalescing, each op is the group's send or recv
        req.wait()


def test_a_batched_recv_whose_sender_ended_without_sending_is_named_not_only_glooss_crash_words():
    diagnosis = what_a_failed_spawn_read(batch_without_its_send, 2)
    text = str(diagnosis)
    assert diagnosis.unmatched == [(1,)], text
    assert "rank 0's irecv #1 from rank 1 (tag 0) of [3] float32 (12 bytes)" in text, text
    assert "rank 1 ended (it finished its job and its process ended) having posted 0 send(s) to rank 0" in text, text


def test_a_send_and_recv_of_different_sizes_are_named_as_the_pair_gloo_matched():
    diagnosis = what_a_failed_spawn_read(sends_four_receives_three, 2)
    text = str(diagnosis)
    [pair] = diagnosis.p2p_mismatched
    assert pair.kind == "size_mismatch" and set(pair.calls) == {0, 1}, text
    assert "rank 0's isend #1 to rank 1 (tag 0) of [4] float32 (16 bytes)" in text, text
    assert "rank 1's irecv #1 from rank 0 (tag 0) of [3] float32 (12 bytes)" in text, text
    assert not diagnosis.unmatched, text


def test_completed_sends_and_recvs_are_not_named_and_the_hang_still_is():
    diagnosis = what_a_failed_spawn_read(ping_pong_then_return, 2)
    text = str(diagnosis)
    assert not diagnosis.p2p_findings, text
    assert "collective #1 is not reached by every rank" in text, text


def all_to_all_single_whose_splits_disagree(rank, port):
    join(rank, port)
    out = torch.empty(4 if rank == 0 else 5)
    dist.all_to_all_single(out, torch.ones(4), output_split_sizes=[2, 2] if rank == 0 else [2, 3],
                           input_split_sizes=[2, 2])


def uneven_all_to_all_single(rank, port):
    join(rank, port)
    sent = [1, 3] if rank == 0 else [2, 2]  # rank 0 sends 1 to itself, 3 to rank 1; rank 1 sends 2 and 2
    received = [1, 2] if rank == 0 else [3, 2]
    out = torch.empty(sum(received))
    dist.all_to_all_single(out, torch.ones(4), output_split_sizes=received, input_split_sizes=sent)
    if rank == 0:
        dist.all_reduce(out)  # a hang after it, so that the doctor reads the records


def test_an_all_to_all_singles_split_sizes_that_disagree_are_named():
    diagnosis = what_a_failed_spawn_read(all_to_all_single_whose_splits_disagree, 2)
    text = str(diagnosis)
    [finding] = diagnosis.mismatched
    assert finding.mismatch == "the sizes differ" and set(finding.calls) == {0, 1}, text
    assert "rank 1 sends itself 2 elements (its input_split_sizes), rank 1 expects 3 from itself" in text, text


def test_uneven_split_sizes_that_agree_are_no_mismatch():
    diagnosis = what_a_failed_spawn_read(uneven_all_to_all_single, 2)
    text = str(diagnosis)
    assert not diagnosis.mismatched, text
    assert "every rank that answered completed collective #1" in text, text


def sum_against_max_spawned(rank, port):
    join(rank, port)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)


def test_a_run_that_completes_with_different_reduce_ops_is_told_once_it_ends(capsys):
    ppkit.spawn(sum_against_max_spawned, args=(free_port(),), nprocs=2, timeout=60)
    out = capsys.readouterr().out
    assert "every rank's job completed, but the collective doctor finds a problem in their records" in out, out
    assert "collective #1 does not match: the reduce op differs" in out, out
    assert_none_left()
    again = ppkit.collective_doctor()  # on demand afterwards: what was printed, not "ended without error"
    assert again.problem and "collective #1 does not match: the reduce op differs" in str(again), str(again)
    assert "ended without error" not in str(again), str(again)
    assert "the last ppkit.spawn run, which completed" in str(again), str(again)


def all_reduces_spawned(rank, port):
    join(rank, port)
    for _ in range(3):
        dist.all_reduce(torch.ones(2))


def test_a_correct_run_that_completes_is_not_told_anything(capsys):
    ppkit.spawn(all_reduces_spawned, args=(free_port(),), nprocs=2, timeout=60)
    out = capsys.readouterr().out
    assert "collective doctor" not in out, out
    assert_none_left()
    again = ppkit.collective_doctor()
    assert not again.problem, str(again)
    assert ("the last ppkit.spawn run ended without error, and the records its ranks sent as they ended show no "
            "problem") in str(again), str(again)


def send_recv_then_a_new_group(rank, world_size, port, new_port):
    """A send/recv in group 0, destroy_process_group, a new group 0: what the record's p2p_calls hold then."""
    import sys

    from ppkit.transport import flight_record

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    t = torch.zeros(4)
    dist.send(t, dst=1) if rank == 0 else dist.recv(t, src=0)
    before = json.loads(flight_record.snapshot(sys._getframe()))["p2p_calls"]
    dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(new_port)  # a new store: the old port's may still answer (torch issue 74666)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    after = json.loads(flight_record.snapshot(sys._getframe()))["p2p_calls"]
    dist.destroy_process_group()
    return before, after


def test_a_destroyed_groups_send_recv_are_not_held_against_its_successors():
    """The new group numbers its calls from 1 again: the old lifetime's #1 is not its #1."""
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        results = cluster.run(send_recv_then_a_new_group, free_port(), free_port())
    (before, after), _ = results
    assert [(c["op"], c["n"], c["state"]) for c in before] == [("isend", 1, "completed")], results
    assert after == [], results
