"""The rank's side of the collective doctor (ppkit/transport/flight_record.py) and its reading in the
kernel, outside a Jupyter kernel: subgroups a rank is not a member of, the abort handler's safety
(no deadlock, the previous handler kept, not in forked children), p2p calls gloo does not record,
and the last words a job keeps. tests/test_hang_doctor.py covers each case as a learner meets it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import ppkit
from ppkit.cluster.hang_doctor import diagnose

pytestmark = [pytest.mark.timeout(300)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def subgroup_then_default(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    group = dist.new_group([0, 1])  # every rank calls new_group, as torch requires
    if rank < 2:
        dist.all_reduce(t, group=group)  # only its members use it: correct code
    dist.all_reduce(t)
    return t[0].item()


def test_a_rank_outside_a_subgroup_sends_its_whole_record():
    with ppkit.Cluster(4, "gloo", timeout=60) as cluster:
        assert cluster.run(subgroup_then_default) == [6.0, 6.0, 6.0, 6.0]
        diagnosis = ppkit.collective_doctor(cluster)
        assert not diagnosis.problem, str(diagnosis)
        assert all(not record.get("error") for record in diagnosis.records.values()), diagnosis.records
        assert all(record["calls"] for record in diagnosis.records.values()), diagnosis.records
        # the record of rank 2 names the default group's all_reduce, and its group table the subgroup's ranks
        assert {tuple(g["ranks"]) for g in diagnosis.records[2]["groups"].values()} == {(0, 1, 2, 3)}


def test_an_op_mismatch_after_a_subgroup_is_still_named():
    call = {"group": "0", "desc": "default_pg", "seq": 1, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
            "profiling_name": "gloo:all_reduce", "input_sizes": [[2]], "output_sizes": [[2]],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled", "done": True,
            "time_created_ns": 1, "at": {}}
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}
    member = {"1": {"desc": "undefined", "ranks": [0, 1]}, **groups}
    sub = {**call, "group": "1", "desc": "undefined"}
    pending = {**call, "seq": 2, "done": False, "time_created_ns": 3}
    records = {r: {"calls": ([{**sub, "time_created_ns": 0}] if r < 2 else []) + [call, pending if r != 3 else
                   {**pending, "op": "broadcast", "profiling_name": "gloo:broadcast"}],
                   "groups": member if r < 2 else groups, "p2p": None} for r in range(4)}
    diagnosis = diagnose(records, 4)
    assert [g.name for g in diagnosis.mismatched] == ["0"], str(diagnosis)
    assert "collective #2 does not match: the op differs" in str(diagnosis)


def test_a_rank_whose_record_failed_says_why():
    diagnosis = diagnose({0: {"calls": [], "groups": {}, "p2p": None, "error": "AttributeError: boom"},
                          1: {"calls": [], "groups": {}, "p2p": None}}, 2)
    assert "rank 0's record is incomplete: AttributeError: boom" in str(diagnosis)


def run_script(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``body`` in a fresh interpreter that has imported flight_record; its rc, stdout and stderr."""
    script = "import os, sys, time, threading\nfrom ppkit.transport import flight_record\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_last_words_that_cannot_be_sent_do_not_hang_the_aborting_rank():
    """The abort arrives while the main thread holds the lock the last words need (Worker._send_lock)."""
    done = run_script("""
        lock = threading.Lock()
        def send():
            with lock:
                sys.stderr.write("last words sent\\n")
        flight_record.on_abort(send)
        import subprocess
        subprocess.Popen(["sh", "-c", f"sleep 1; kill -ABRT {os.getpid()}"])
        start = time.time()
        while time.time() - start < 20:
            with lock:
                sum(range(10000))
        print("still alive after 20 s", flush=True)
    """)
    assert "still alive" not in done.stdout and done.returncode < 0, (done.returncode, done.stdout, done.stderr)


def test_faulthandler_still_prints_its_traceback_after_the_last_words():
    done = run_script("""
        import faulthandler
        faulthandler.enable()
        flight_record.on_abort(lambda: (sys.stderr.write("ppkit last words ran\\n"), sys.stderr.flush()))
        os.abort()
    """)
    assert "ppkit last words ran" in done.stderr, done.stderr
    assert "Fatal Python error: Aborted" in done.stderr and done.returncode == -6, (done.returncode, done.stderr)


def test_a_forked_child_that_aborts_sends_no_last_words_for_the_rank():
    done = run_script("""
        parent = os.getpid()
        flight_record.on_abort(lambda: print(f"last words from {os.getpid()}", flush=True))
        pid = os.fork()
        if pid == 0:
            os.abort()  # a DataLoader worker, forked from the rank
        _, status = os.waitpid(pid, 0)
        print("child ended by signal", os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)
    """)
    assert "last words from" not in done.stdout, done.stdout
    assert "child ended by signal 6" in done.stdout, (done.stdout, done.stderr)


class FakeInbox:
    """The kernel's inbox as ask_records reads it: items in order, then nothing."""

    def __init__(self, items):
        self.items, self.back = list(items), []

    def next(self, deadline):
        return self.items.pop(0) if self.items else None

    def put_back(self, items):
        self.back.extend(items)


def test_a_rank_whose_last_words_arrived_is_not_waited_for():
    from ppkit.cluster.hang_doctor import ask_records
    from ppkit.cluster.inbox import Item
    from ppkit.transport.flight_messages import FlightRecord

    words = Item(1, FlightRecord(7, '{"calls": [], "groups": {}, "p2p": null, "at": {}, "marker": "last"}', True))
    answer = Item(0, FlightRecord(7, '{"calls": [], "groups": {}, "p2p": null, "at": {}}'))

    class Slow(FakeInbox):
        def next(self, deadline):  # nothing more comes: wait out the deadline, as the real inbox does
            return super().next(deadline) or time.sleep(max(0.0, deadline - time.monotonic()))

    start = time.monotonic()
    found = ask_records(lambda rank, msg: True, Slow([words, answer]), [0, 1], wait=5)
    assert sorted(found) == [0, 1] and found[1]["marker"] == "last"
    assert time.monotonic() - start < 4  # rank 1 aborted: its answer never comes, so it is not awaited
    known = {1: found[1]}
    asked = []
    ask_records(lambda rank, msg: asked.append(rank) or True, FakeInbox([answer]), [0, 1], known, wait=5)
    assert asked == [0]  # a rank whose last words are known is gone: not asked again


def test_only_a_ranks_last_words_for_this_job_are_kept():
    from ppkit.cluster.hang_doctor import last_words
    from ppkit.cluster.inbox import Item
    from ppkit.transport.flight_messages import FlightRecord

    text = '{"calls": [], "groups": {}, "p2p": null, "at": {}}'
    assert last_words(Item(0, FlightRecord(7, text, True)), 7) == {"calls": [], "groups": {}, "p2p": None, "at": {}}
    assert last_words(Item(0, FlightRecord(7, text, False)), 7) is None  # a late answer to a question
    assert last_words(Item(0, FlightRecord(6, text, True)), 7) is None  # an earlier job's
    assert last_words(Item(0, FlightRecord(None, text, True)), 7) is not None  # between jobs: aborting now


def sleep_a_while(rank, world_size):
    import time

    time.sleep(6)
    return rank


def test_the_doctor_on_demand_does_not_read_the_inbox_of_a_running_job():
    """A widget's callback may run a job from another thread: the doctor must not take that job's messages."""
    import threading

    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        results = []
        job = threading.Thread(target=lambda: results.append(cluster.run(sleep_a_while)))
        job.start()
        try:
            time.sleep(2)
            with pytest.raises(ppkit.ClusterStateError, match="a job is running on this cluster"):
                ppkit.collective_doctor(cluster)
        finally:
            job.join()
        assert results == [[0, 1]]
        assert sorted(cluster.flight_records()) == [0, 1]  # between jobs: every rank answers


def recv_from_each_other_in_a_subgroup(i, port):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=4)
    group = dist.new_group([2, 3])
    if i >= 2:
        dist.recv(torch.zeros(3), group=group, group_src=3 - i)  # group ranks 1 and 0: global 3 and 2
    else:
        time.sleep(30)


def test_a_recv_pair_in_a_subgroup_is_named_by_global_ranks(capsys):
    from ppkit.cluster.worker_setup import free_port

    with pytest.raises(ppkit.JobTimeoutError):
        ppkit.spawn(recv_from_each_other_in_a_subgroup, args=(free_port(),), nprocs=4, timeout=10)
    text = capsys.readouterr().out
    assert "rank 2 waits in recv from rank 3 of [3] float32" in text, text
    assert "ranks 2 and 3 each wait on the other" in text, text


def test_at_eight_ranks_identical_calls_share_one_line():
    call = {"group": "0", "desc": "default_pg", "seq": 2, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
            "profiling_name": "gloo:all_reduce", "input_sizes": [[4]], "output_sizes": [[4]],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled", "done": False,
            "time_created_ns": 2, "at": {}}
    odd = {**call, "op": "broadcast", "profiling_name": "gloo:broadcast"}
    groups = {"0": {"desc": "default_pg", "ranks": list(range(8))}}
    first = {**call, "seq": 1, "done": True, "time_created_ns": 1}
    text = str(diagnose({r: {"calls": [first, odd if r == 5 else call], "groups": groups, "p2p": None}
                         for r in range(8)}, 8))
    assert "      ranks 0-4,6-7: all_reduce #2 of [4] Float\n" in text, text
    assert "      rank 5: broadcast #2 of [4] Float\n" in text, text
    assert text.count("all_reduce #2") == 1, text
