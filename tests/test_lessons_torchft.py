"""Lesson 15's per-step fault tolerance with torchft (ppkit/lessons/fault_tolerance): the lighthouse as a process,
replica groups of fault-tolerant DDP on gloo, one killed with SIGKILL and brought back, LocalSGD's syncs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from ppkit.errors import ConfigError, LaunchError, WorkerDiedError
from ppkit.lessons.fault_tolerance import Kill, Lighthouse, TorchftRun, require_torchft, run_replicas

needs_torchft = pytest.mark.skipif(  # under CI=true a missing torchft fails the tests instead (CI installs it)
    __import__("importlib.util").util.find_spec("torchft") is None and __import__("os").environ.get("CI") != "true",
    reason="torchft is not installed (pip install -e '.[ft]'; it has wheels for Linux x86_64 only)")
KILLED, AT_STEP, BACK_AFTER, STEPS = 2, 5, 3, 40


def lesson_processes() -> list[psutil.Process]:
    """This test's lighthouse and replica processes still alive."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any("fault_tolerance" in part for part in proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


# -- the lighthouse ---------------------------------------------------------------------------------
@needs_torchft
def test_the_lighthouse_starts_as_a_process_listens_and_stops_leaving_nothing():
    lighthouse = Lighthouse()
    with lighthouse:
        pid, port = lighthouse.pid, lighthouse.port
        assert psutil.pid_exists(pid) and lighthouse.address == f"http://127.0.0.1:{port}"
        assert not refuses(port)
        assert "running" in repr(lighthouse)
    assert not lighthouse.running and lighthouse.pid is None
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert refuses(port)
    lighthouse.stop()  # idempotent
    assert lesson_processes() == []


@needs_torchft
@pytest.mark.slow
def test_the_lighthouse_dies_with_the_process_that_started_it():
    code = ("from ppkit.lessons.fault_tolerance import Lighthouse; import sys, time; "
            "l = Lighthouse().start(); print(l.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        lighthouse_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(lighthouse_pid)
        parent.send_signal(signal.SIGKILL)  # a kernel killed: no stop(), no atexit
        parent.wait()
        assert psutil.wait_procs([psutil.Process(lighthouse_pid)], timeout=5)[1] == []
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_without_torchft_the_error_says_what_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    with pytest.raises(LaunchError, match=r"torchft is not installed.*pip install 'torchft==0\.2\.0'"):
        require_torchft()
    with pytest.raises(LaunchError, match="Linux x86_64"):
        run_replicas(2, steps=4)
    assert lesson_processes() == []


@pytest.mark.parametrize("kwargs, says", [
    (dict(num_replicas=0), "num_replicas=0"),
    (dict(mode="fsdp"), "mode='fsdp'"),
    (dict(sync_every=0), "sync_every=0"),
    (dict(kill=Kill(replica=3, at_step=2)), "replica groups are 0..2"),
    (dict(steps=10, kill=Kill(replica=1, at_step=5, back_after=6)), "give at least steps=19"),
    (dict(kill=Kill(replica=1, at_step=0)), "at_step=0"),
    (dict(mode="localsgd", kill=Kill(replica=1, at_step=2)), "kill= is for mode='ddp'"),
    (dict(num_replicas=1, kill=Kill(replica=0, at_step=2)), "at least 2 replica groups"),
])
def test_wrong_arguments_are_refused_before_anything_starts(kwargs, says):
    with pytest.raises(ConfigError, match=__import__("re").escape(says)):
        run_replicas(**{"num_replicas": 3, "steps": 20, **kwargs})
    assert lesson_processes() == []


# -- what the records say (hand-made records: the reading, not torchft) ------------------------------
def step(replica, s, participants, incarnation=0, healed=False, t=0.0, committed=True):
    return dict(replica=replica, incarnation=incarnation, step=s, committed=committed, healed=healed,
                participants=participants, t=t, loss=float(s))


def test_steps_missed_counts_the_dead_steps_and_the_one_recovered_in():
    records = ([step(0, s, 2 if 3 <= s <= 5 else 3) for s in range(1, 9)]
               + [step(1, s, 3) for s in (1, 2)] + [step(1, 6, 2, incarnation=1, healed=True)]
               + [step(1, s, 3, incarnation=1) for s in (7, 8)])
    done = {i: {"step": 8, "weights_sha256": "a", "allreduce_bytes": 8} for i in range(2)}
    run = TorchftRun("ddp", 2, 8, None, Kill(1, 2, 3), records, done)
    assert run.steps_missed() == {0: [], 1: [3, 4, 5, 6]}
    assert run.quorum_sizes() == {1: 3, 2: 3, 3: 2, 4: 2, 5: 2, 6: 3, 7: 3, 8: 3}
    assert run.recovered and run.recovery_step == 6 and run.weights_equal
    assert run.loss_curve(1) == [(1, 1.0), (2, 2.0), (6, 6.0), (7, 7.0), (8, 8.0)]  # committed steps, both lives
    run.done[1] = {**done[1], "weights_sha256": "b"}
    assert not run.weights_equal
    del run.done[1]
    assert not run.weights_equal  # a replica that never finished is not equal


# -- a replica killed at step k and brought back (one run, several questions) ---------------------------
@pytest.fixture(scope="module")
def killed_run() -> TorchftRun:
    run = run_replicas(3, steps=STEPS, kill=Kill(replica=KILLED, at_step=AT_STEP, back_after=BACK_AFTER))
    assert lesson_processes() == []
    return run


@needs_torchft
@pytest.mark.slow
def test_after_a_kill_at_step_k_the_others_go_on_at_the_next_step_with_a_smaller_quorum(killed_run):
    k = killed_run.killed_after_step
    assert k >= AT_STEP and [r["step"] for r in killed_run.of(KILLED, 0)][-1] == k
    for replica in (0, 1):
        sizes = killed_run.quorum_sizes(replica)
        assert sizes[k] == 3 and sizes[k + 1] == 2, sizes
        quorum = {r["step"]: r["quorum"] for r in killed_run.of(replica) if r["committed"]}
        assert quorum[k] == [0, 1, 2] and quorum[k + 1] == [0, 1]
        assert sorted(sizes) == list(range(1, STEPS + 1))  # every step was done once, none lost
    assert 0 < killed_run.stall_seconds < 10  # about the lighthouse's heartbeat timeout (1.5 s)


@needs_torchft
@pytest.mark.slow
def test_the_killed_replica_comes_back_recovers_from_a_peer_and_ends_with_equal_weights(killed_run):
    assert killed_run.recovered, killed_run.of(KILLED, 1)[:3]
    back = killed_run.of(KILLED, 1)
    first = back[0]
    assert first["healed"] and first["step"] == killed_run.recovery_step > killed_run.killed_after_step + BACK_AFTER
    assert first["quorum"] == [0, 1, 2]
    assert killed_run.weights_equal and killed_run.final_steps() == {0: STEPS, 1: STEPS, 2: STEPS}
    missed = killed_run.steps_missed()
    assert missed[0] == missed[1] == []
    assert missed[KILLED] == list(range(killed_run.killed_after_step + 1, killed_run.recovery_step + 1))
    assert 0 < killed_run.recovery_seconds < 30


# -- LocalSGD against DDP ------------------------------------------------------------------------------
@needs_torchft
@pytest.mark.slow
def test_localsgd_syncs_every_h_steps_and_all_reduces_an_hth_of_ddps_bytes():
    h, steps = 4, 12
    with Lighthouse() as lighthouse:
        local = run_replicas(2, steps=steps, mode="localsgd", sync_every=h, step_seconds=0.02, lighthouse=lighthouse)
        ddp = run_replicas(2, steps=steps, mode="ddp", step_seconds=0.02, lighthouse=lighthouse)
    for replica in (0, 1):
        assert [r["step"] for r in local.of(replica) if r["synced"]] == [4, 8, 12]
    assert local.syncs() == {0: 3, 1: 3} and ddp.syncs() == {0: 12, 1: 12}
    param_bytes = local.done[0]["param_bytes"]
    assert local.allreduce_bytes() == {0: 3 * param_bytes, 1: 3 * param_bytes}
    assert ddp.allreduce_bytes() == {0: 12 * param_bytes, 1: 12 * param_bytes}
    assert local.weights_equal and ddp.weights_equal  # LocalSGD's last step was a sync
    assert lesson_processes() == []


# -- how failures end ------------------------------------------------------------------------------------
@needs_torchft
@pytest.mark.slow
def test_a_replica_killed_by_someone_else_ends_the_run_with_worker_died_and_nothing_left():
    def kill_one_replica():  # once it trains: once its records file has a step
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for proc in lesson_processes():
                try:
                    records = [f.path for f in proc.open_files() if "records-" in f.path]
                    if records and '"event": "step"' in open(records[0]).read():
                        proc.send_signal(signal.SIGKILL)
                        return
                except (psutil.NoSuchProcess, OSError):
                    continue
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_replica, daemon=True)
    killer.start()
    said = r"was killed by signal SIGKILL while training, and nobody killed it"
    with pytest.raises(WorkerDiedError, match=said) as err:
        run_replicas(2, steps=200)
    assert err.value.how == "was killed by signal SIGKILL"
    killer.join()
    assert lesson_processes() == []


@needs_torchft
@pytest.mark.slow
def test_replicas_that_do_not_join_in_time_end_with_a_launch_error_and_nothing_left():
    with pytest.raises(LaunchError, match=r"did not finish within 1 s.*did not all join.*give timeout_s more"):
        run_replicas(2, steps=4, timeout_s=1)
    assert lesson_processes() == []


def wait_for_training(deadline_s: float = 120) -> None:
    """Until one of this test's replicas has written a step."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for proc in lesson_processes():
            try:
                records = [f.path for f in proc.open_files() if "records-" in f.path]
                if records and '"event": "step"' in open(records[0]).read():
                    return
            except (psutil.NoSuchProcess, OSError):
                continue
        time.sleep(0.05)


@needs_torchft
@pytest.mark.slow
def test_a_lighthouse_that_dies_mid_run_ends_it_at_once_saying_so():
    lighthouse = Lighthouse().start()

    def kill_the_lighthouse():
        wait_for_training()
        os.kill(lighthouse.pid, signal.SIGKILL)

    threading.Thread(target=kill_the_lighthouse, daemon=True).start()
    started = time.monotonic()
    try:
        said = r"torchft's lighthouse .* died .*SIGKILL.*no quorum .*\(Lighthouse\(\)\)"
        with pytest.raises(WorkerDiedError, match=said):
            run_replicas(2, steps=400, lighthouse=lighthouse)
    finally:
        lighthouse.stop()
    assert time.monotonic() - started < 60  # not the replicas' 30 s quorum timeout after their start
    assert lesson_processes() == []


@needs_torchft
@pytest.mark.slow
def test_an_interrupt_mid_run_stops_every_replica_and_the_lighthouse():
    import _thread

    def interrupt():
        wait_for_training()
        _thread.interrupt_main()  # what Kernel > Interrupt does to a cell

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_replicas(2, steps=400)
    assert lesson_processes() == []


@needs_torchft
def test_a_lighthouse_that_does_not_start_in_time_says_so_and_leaves_nothing():
    lighthouse = Lighthouse(start_timeout_s=0.001)
    with pytest.raises(LaunchError, match=r"lighthouse did not start within 0\.001 s .*its log: .*Check that torchft"):
        lighthouse.start()
    assert not lighthouse.running and lesson_processes() == []
    lighthouse.stop()


@needs_torchft
@pytest.mark.slow
def test_a_kill_in_the_middle_of_a_step_costs_the_survivor_that_step_only():
    """Replica 1 is killed in step 6, between its forward and its backward, while replica 0 waits for its
    gradients in the all-reduce. torchft 0.2.0's DDP comm hook then fails an assert (``assert fut._fut``) and
    the survivor dies too; the lesson's DDP drops the step instead (should_commit says no) and does it again."""
    run = run_replicas(2, steps=12, step_seconds=0.05, kill=Kill(replica=1, at_step=5, back_after=None, mid_step=True))
    assert run.killed_after_step == 5
    attempts = [(r["step_before"], r["committed"], r["participants"]) for r in run.of(0)]
    assert attempts[:5] == [(s, True, 2) for s in range(5)]
    assert attempts[5] == (5, False, 2)  # the all-reduce of step 6 failed: the step is dropped
    assert attempts[6:] == [(s, True, 1) for s in range(5, 12)]  # and done again, alone
    assert run.final_steps() == {0: 12} and run.steps_missed()[0] == []
    assert lesson_processes() == []
