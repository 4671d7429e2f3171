"""``ppkit.fail_rank``: a rank failed on purpose while it trains, on each entry point (``cluster.run``,
``ppkit.spawn``, ``%%torchrun``) and in each way (killed now with SIGKILL, killed at a step with SIGTERM,
an exception at a step, a hang at a step): each run ends with a clear error that names the fault, and
no process of it is left."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from leftovers import ppkit_children, wait_gone

import ppkit
from ppkit.cluster.faults import arming
from ppkit.cluster.spawn import call as spawn_call
from ppkit.cluster.torchrun import magic

STEPS = 150  # 10 ms each: the ranks that are not failed finish in about 1.5 s
LOOP = f'''\
import os, sys, time
import ppkit
rank = int(os.environ["RANK"])
for i in range({STEPS}):
    ppkit.step(i)
    if i == 0:
        open(os.path.join(sys.argv[1], f"started-{{rank}}"), "w").close()
    time.sleep(0.01)
'''


def loop(rank: int, folder: str) -> None:
    for i in range(STEPS):
        ppkit.step(i)
        if i == 0:
            Path(folder, f"started-{rank}").write_text(str(os.getpid()))
        time.sleep(0.01)


def on_cluster(rank, world_size, folder):
    loop(rank, folder)
    return rank


@pytest.fixture(scope="module")
def cluster():
    cluster = ppkit.Cluster(2, "gloo", process_group=False)
    yield cluster
    cluster.close()
    spawn_call.close()
    assert wait_gone([p.pid for p in ppkit_children()], timeout=5.0) == []


@pytest.fixture(autouse=True)
def _nothing_armed():
    yield
    arming._armed.clear()


def rank_processes(cluster) -> list[int]:
    """ppkit's processes but the fork servers ppkit.spawn keeps and the module's cluster's."""
    me, theirs = os.getpid(), {p.pid for p in cluster.processes()}
    return [p.pid for p in ppkit_children() if p.pid not in theirs
            and not (p.ppid() == me and "ppkit.transport.zygote" in " ".join(p.cmdline()))]


def run_on(entry: str, cluster, folder, timeout: float):
    if entry == "cluster":
        if cluster.state != "ready":
            cluster.restart()
        return cluster.run(on_cluster, str(folder), timeout=timeout)
    if entry == "spawn":
        return ppkit.spawn(loop, args=(str(folder),), nprocs=2, timeout=timeout)
    return magic.torchrun(f"--nproc-per-node 2 --timeout {timeout:g} -- {folder}", LOOP)


def kill_when_started(folder, **kwargs) -> threading.Thread:
    """``ppkit.fail_rank(1, **kwargs)`` from another thread (a widget's callback) once both ranks train."""
    def watch():
        deadline = time.monotonic() + 60
        while len(list(folder.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        ppkit.fail_rank(1, **kwargs)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def assert_gone(entry: str, cluster) -> None:
    if entry == "cluster":  # its ranks are the cluster's until it restarts; then none of the old ones is left
        old = [w["pid"] for w in cluster.workers.values()]
        cluster.restart()
        assert wait_gone([pid for pid in old if psutil.pid_exists(pid)], timeout=5.0) == []
    else:
        assert wait_gone(rank_processes(cluster), timeout=5.0) == []


ENTRIES = ["cluster", "spawn", "torchrun"]


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_kill_now_with_sigkill_ends_the_run_naming_the_fault(entry, cluster, tmp_path):
    thread = kill_when_started(tmp_path)  # no at_step: the rank is killed now, with no change to its loop
    with pytest.raises(ppkit.WorkerDiedError) as info:
        run_on(entry, cluster, tmp_path, 60)
    thread.join()
    err = info.value
    assert err.ranks == [1] and os.WIFSIGNALED(err.status) and os.WTERMSIG(err.status) == signal.SIGKILL
    if entry != "cluster":
        assert isinstance(err, ppkit.ProcessExitedError) and err.signal_name == "SIGKILL"
    assert err.__notes__ == ["rank 1 failed on purpose: ppkit.fail_rank(1, how='kill', signal='SIGKILL'), killed "
                             "from the kernel while the run went on. The other ranks ended as they would after a "
                             "real failure."]
    assert_gone(entry, cluster)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_kill_at_a_step_with_sigterm_ends_the_run_naming_the_fault(entry, cluster, tmp_path):
    armed = ppkit.fail_rank(1, signal="SIGTERM", at_step=20)
    assert armed.armed and not armed.fired
    with pytest.raises(ppkit.WorkerDiedError) as info:
        run_on(entry, cluster, tmp_path, 60)
    err = info.value
    assert err.ranks == [1] and os.WTERMSIG(err.status) == signal.SIGTERM and "SIGTERM" in str(err)
    assert err.__notes__ == ["rank 1 failed on purpose: ppkit.fail_rank(1, how='kill', signal='SIGTERM', "
                             "at_step=20), at ppkit.step(20). The other ranks ended as they would after a real "
                             "failure."]
    assert not armed.armed  # used: the next run is not failed again
    assert_gone(entry, cluster)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_raise_at_a_step_shows_the_loops_line(entry, cluster, tmp_path):
    ppkit.fail_rank(1, how="raise", at_step=20)
    with pytest.raises(ppkit.RemoteError) as info:
        run_on(entry, cluster, tmp_path, 60)
    err = info.value
    assert err.ranks == [1] and err.exc_types[1] == "InjectedFailure"
    assert err.messages[1] == "rank 1 failed at step 20, on purpose: ppkit.fail_rank(1, how='raise', at_step=20)"
    assert "ppkit.step(i)" in err.tracebacks[1]  # the learner's own line, where it failed
    if entry != "cluster":
        assert isinstance(err, ppkit.ProcessRaisedError) and err.error_index == 1
    assert_gone(entry, cluster)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
def test_a_hang_at_a_step_ends_at_the_timeout_saying_where_it_hangs(entry, cluster, tmp_path):
    ppkit.fail_rank(1, how="hang", at_step=20)
    with pytest.raises(ppkit.JobTimeoutError) as info:
        run_on(entry, cluster, tmp_path, 4)
    err = info.value
    assert err.ranks == [1] and "ppkit.step(i)" in err.stacks[1]
    assert "rank 1 failed on purpose: ppkit.fail_rank(1, how='hang', at_step=20)" in err.__notes__[0]
    assert_gone(entry, cluster)


@pytest.mark.slow
def test_a_kill_after_some_seconds_needs_no_change_to_the_loop(cluster, tmp_path):
    def plain(rank, folder):  # no ppkit.step
        time.sleep(0.01 * STEPS)

    ppkit.fail_rank(0, signal=signal.SIGTERM, after=0.3)
    with pytest.raises(ppkit.ProcessExitedError) as info:
        ppkit.spawn(plain, args=(str(tmp_path),), nprocs=2)
    assert info.value.error_index == 0 and info.value.signal_name == "SIGTERM"
    assert "0.3 s into the run" in info.value.__notes__[0]
    assert_gone("spawn", cluster)


@pytest.mark.slow
def test_a_fault_that_does_not_fire_is_said_and_dropped(cluster, tmp_path, capsys):
    armed = ppkit.fail_rank(1, how="raise", at_step=10 * STEPS)
    ppkit.spawn(loop, args=(str(tmp_path),), nprocs=2)
    assert ("[ppkit] ppkit.fail_rank(1, how='raise', at_step=1500) did not fire: ppkit.spawn's run ended first "
            "(rank 1's loop never called ppkit.step(i) with i >= 1500)") in capsys.readouterr().out
    assert not armed.armed
    assert_gone("spawn", cluster)


@pytest.mark.slow
def test_a_fault_fails_the_first_attempt_of_a_restarted_run_only(cluster, tmp_path, capsys):
    ppkit.fail_rank(1, how="raise", at_step=20)
    magic.torchrun(f"--nproc-per-node 2 --max-restarts 1 -- {tmp_path}", LOOP)  # attempt 1 succeeds
    out = capsys.readouterr().out
    assert "[ppkit] attempt 0 of 2 failed: rank 1 (pid " in out
    assert "raised InjectedFailure: rank 1 failed at step 20, on purpose" in out
    assert_gone("torchrun", cluster)


def test_a_rank_the_run_does_not_have_is_refused_before_it_starts(cluster, tmp_path):
    ppkit.fail_rank(5, how="raise", at_step=1)
    with pytest.raises(ppkit.ConfigError, match=r"names rank 5, and this run has ranks 0 to 1: nothing ran"):
        ppkit.spawn(loop, args=(str(tmp_path),), nprocs=2)
    assert not arming._armed


def test_cancel_disarms_a_fault():
    armed = ppkit.fail_rank(1, how="hang", at_step=3)
    assert repr(armed) == "<ppkit.fail_rank(1, how='hang', at_step=3): armed>"
    assert armed.cancel() and not armed.armed and not armed.cancel()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rank": -1}, "needs the rank to fail, a whole number from 0, got -1"),
    ({"rank": 1, "how": "crash"}, "how='crash': a rank can be failed by 'kill'"),
    ({"rank": 1, "how": "raise", "signal": "SIGTERM"}, "signal='SIGTERM' goes with how='kill' only"),
    ({"rank": 1, "signal": "SIGNOPE"}, "signal='SIGNOPE' is not a signal of this system"),
    ({"rank": 1, "at_step": -2}, "at_step=-2: give the step, a whole number from 0"),
    ({"rank": 1, "how": "hang", "after": 2}, "after=2 goes with how='kill' only"),
    ({"rank": 1, "at_step": 3, "after": 2}, "give at_step or after, not both"),
    ({"rank": 1, "after": -1}, "after=-1: give the seconds into the run"),
])
def test_a_wrong_argument_says_what_to_write(kwargs, message):
    with pytest.raises(ppkit.ConfigError, match=message.replace("(", r"\(")):
        ppkit.fail_rank(**kwargs)
    assert not arming._armed


def test_step_does_nothing_outside_a_rank_and_signals_are_read_by_name_or_number():
    ppkit.step(0)
    assert ppkit.fail_rank(1, signal="term", at_step=1).fault.signal == signal.SIGTERM
    assert ppkit.fail_rank(1, signal=signal.SIGINT, at_step=1).fault.signal_name == "SIGINT"
    assert ppkit.fail_rank(1, signal=9, at_step=1).fault.signal_name == "SIGKILL"
