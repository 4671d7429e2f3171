"""ppkit.spawn: mp.spawn's ``fn(i, *args)`` in fresh processes, for functions and classes defined
where the call is (as in a notebook cell); how each failure ends (an exception, an exit, a hang,
Ctrl-C, something that cannot be pickled, a taken port), with both start methods; and no process of
a call outlives it (only the fork server ppkit.spawn keeps between calls stays)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist
from leftovers import ppkit_children, wait_gone

import ppkit
from ppkit.cluster.oom import OomWatch
from ppkit.cluster.spawn import call as spawn_call
from ppkit.cluster.spawn import explain
from ppkit.lessons.data_parallel import free_port


@pytest.fixture(scope="module", autouse=True)
def _close_fork_servers():
    yield
    spawn_call.close()


@pytest.fixture(params=["forkserver", "spawn"])
def method(request):
    return request.param


def rank_processes() -> list[int]:
    """This run's ppkit processes but the fork servers that ppkit.spawn keeps between calls."""
    me = os.getpid()
    return [p.pid for p in ppkit_children()
            if not (p.ppid() == me and "ppkit.transport.zygote" in " ".join(p.cmdline()))]


def assert_none_left() -> None:
    assert wait_gone(rank_processes(), timeout=5.0) == []


def _started(folder, i):
    (folder / f"started-{i}").write_text(str(os.getpid()))


def _interrupt_when_started(folder, count: int) -> threading.Thread:
    """Ctrl-C in the main thread once ``count`` processes have written their started file."""
    def watch():
        deadline = time.monotonic() + 60
        while len(list(folder.glob("started-*"))) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # what Kernel > Interrupt does

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


# -- what works ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_fn_of_i_and_args_runs_in_fresh_processes_each_call(method, tmp_path, capsys, monkeypatch):
    spawn_call.close()
    monkeypatch.setenv("PPKIT_SPAWN_GONE", "set at first")

    class Greeting:  # a class and a function defined here, not importable by name: as in a cell
        def __init__(self, word):
            self.word = word

    def record(i, word, folder):
        print(f"hello from {i}")
        env = (os.environ.get("PPKIT_SPAWN_NEW"), os.environ.get("PPKIT_SPAWN_GONE"))
        (folder / f"{i}-{os.getpid()}").write_text(f"{Greeting(word).word} {env}")

    calls = [tmp_path / "0", tmp_path / "1"]
    for call, folder in enumerate(calls):
        folder.mkdir()
        if call == 1:  # mp.spawn's processes see the environment of the moment
            monkeypatch.setenv("PPKIT_SPAWN_NEW", "set later")
            monkeypatch.delenv("PPKIT_SPAWN_GONE")
        assert ppkit.spawn(record, args=("hi", folder), nprocs=2, start_method=method) is None
        assert_none_left()
    pids = [{name.split("-")[1] for name in os.listdir(folder)} for folder in calls]
    assert [sorted(name.split("-")[0] for name in os.listdir(f)) for f in calls] == [["0", "1"]] * 2
    assert len(pids[0]) == len(pids[1]) == 2 and not pids[0] & pids[1]  # fresh processes every call
    texts = {(f.name, p.name.split("-")[0]): p.read_text() for f in calls for p in f.iterdir()}
    assert texts[("0", "0")] == "hi (None, 'set at first')"
    assert texts[("1", "1")] == "hi ('set later', None)"
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


@pytest.mark.slow
def test_sys_exit_0_ends_a_process_successfully_as_with_mp_spawn():
    ppkit.spawn(lambda i: sys.exit(0) if i else None, nprocs=2)
    assert_none_left()


@pytest.mark.slow
def test_join_false_returns_a_context_whose_join_works_as_mp_spawns(tmp_path):
    def slow(i, folder):
        time.sleep(1.0)
        (folder / str(i)).write_text("done")

    context = ppkit.spawn(slow, args=(tmp_path,), nprocs=2, join=False)
    assert isinstance(context, ppkit.SpawnContext) and len(set(context.pids())) == 2
    with pytest.raises(ppkit.ClusterStateError, match=r"join=False\) is still running. Call its join\(\) first"):
        ppkit.spawn(slow, args=(tmp_path,), nprocs=2)
    assert context.join(timeout=0.01) is False
    assert context.join() is True and context.join() is True
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]
    assert_none_left()

    failing = ppkit.spawn(lambda i: 1 / i, nprocs=2, join=False)
    with pytest.raises(ppkit.ProcessRaisedError, match="process 0 of 2 .* raised ZeroDivisionError"):
        failing.join()
    assert_none_left()


@pytest.mark.slow
def test_the_fork_servers_kept_between_calls_are_the_most_recent_two():
    for nprocs in (1, 2, 3):
        ppkit.spawn(lambda i: None, nprocs=nprocs)
    assert [key[0] for key in spawn_call._kept] == [2, 3]
    servers = [p for p in ppkit_children()
               if p.ppid() == os.getpid() and "ppkit.transport.zygote" in " ".join(p.cmdline())]
    assert len([p for p in servers if p.status() != "zombie"]) == 2  # the first one was closed


# -- how failures end ------------------------------------------------------------------------------
@pytest.mark.slow
def test_an_exception_in_one_process_raises_with_its_traceback_rank_and_pid(method):
    def fail_on_1(i):
        if i == 1:
            raise ValueError(f"no good on process {i}")
        time.sleep(60)  # process 0 would wait for ever: it must be stopped

    started = time.monotonic()
    with pytest.raises(ppkit.ProcessRaisedError) as info:
        ppkit.spawn(fail_on_1, nprocs=2, start_method=method)
    err = info.value
    message = str(err)
    assert isinstance(err, ppkit.RemoteError) and err.error_index == 1 and err.ranks == [1]
    assert message.startswith(f"process 1 of 2 (pid {err.pid}) raised ValueError: no good on process 1. "
                              "Every process of this call has been stopped")
    assert 'raise ValueError(f"no good on process {i}")' in err.tracebacks[1]
    assert "time.sleep(60)" in err.stacks[0] and "--- rank 0 is waiting here ---" in message
    assert "cluster.restart" not in message
    assert time.monotonic() - started < 40
    assert_none_left()


EXITS = [("sys.exit", 3, None, "forkserver"), ("os._exit", 4, None, "forkserver"),
         ("SIGKILL", None, "SIGKILL", "forkserver"), ("os._exit", 4, None, "spawn")]


@pytest.mark.slow
@pytest.mark.parametrize("how, code, sig, method", EXITS)
def test_a_process_that_exits_raises_process_exited_error(how, code, sig, method):
    def exit_on_1(i, how):
        if i == 1:
            if how == "sys.exit":
                sys.exit(3)
            if how == "os._exit":
                os._exit(4)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    with pytest.raises(ppkit.ProcessExitedError) as info:
        ppkit.spawn(exit_on_1, args=(how,), nprocs=2, start_method=method)
    err = info.value
    assert isinstance(err, ppkit.WorkerDiedError)
    assert (err.error_index, err.exit_code, err.signal_name) == (1, code, sig)
    assert str(err).startswith(f"process 1 of 2 (pid {err.pid}) ")
    counted = OomWatch.start().kills_at_start is not None  # the cgroup can say whether the OOM killer did it
    killed = "not by the out-of-memory killer" if counted else "if memory ran out, the kernel's out-of-memory killer"
    assert {"sys.exit": "called sys.exit(3) before fn returned: exit code 3",
            "os._exit": "ended before fn returned: it exited with code 4",
            "SIGKILL": f"it was killed by signal SIGKILL; {killed}"}[how] in str(err)
    assert "Every process of this call has been stopped" in str(err)
    assert_none_left()


def hang_in_recv(i, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    if i == 0:
        dist.recv(torch.zeros(1), src=1)  # process 1 never sends
    else:
        dist.barrier()  # nor does it finish: a finished process would be gone, and the recv fail at once


@pytest.mark.slow
def test_a_hang_past_the_timeout_says_where_each_process_waits(method):
    with pytest.raises(ppkit.JobTimeoutError) as info:
        ppkit.spawn(hang_in_recv, args=(free_port(),), nprocs=2, timeout=8, start_method=method)
    err = info.value
    message = str(err)
    assert message.startswith("the processes did not finish within 8 s (ppkit.spawn's timeout): process(es) [0, 1] "
                              "were still running. Every process")
    assert "Usually a send without a matching recv" in message and "ppkit.spawn(..., timeout=SECONDS)" in message
    assert err.ranks == [0, 1] and "dist.recv(torch.zeros(1), src=1)" in err.stacks[0]
    assert "dist.barrier()" in err.stacks[1]
    assert_none_left()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["python", "collective"])
def test_ctrl_c_stops_every_process_and_says_where_each_was(tmp_path, where):
    def wait(i, folder, where, port):
        if where == "collective":
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            dist.init_process_group("gloo", rank=i, world_size=2)
        _started(folder, i)
        if where == "collective" and i == 0:
            dist.recv(torch.zeros(1), src=1)  # blocked in C++: a cancel cannot reach it
        elif where == "collective":
            dist.barrier()  # process 1 too: a finished one would be gone, and rank 0's recv fail
        while where == "python":  # a cancel lands in Python code (not in a C call such as time.sleep)
            sum(range(1000))

    ppkit.spawn(lambda i: None, nprocs=2)  # the fork server is up: Ctrl-C lands in the job
    _interrupt_when_started(tmp_path, 2)
    with pytest.raises(ppkit.JobInterrupted) as info:
        ppkit.spawn(wait, args=(tmp_path, where, free_port()), nprocs=2)
    err = info.value
    assert str(err).startswith("interrupted")
    assert f"{explain.STOPPED} Where each process was:" in str(err)
    if where == "python":
        assert err.ranks == [] and all("sum(range(1000))" in err.stacks[r] for r in (0, 1))
    else:
        assert err.ranks == [0, 1] and "dist.recv(torch.zeros(1), src=1)" in err.stacks[0]
        assert "dist.barrier()" in err.stacks[1] and "blocked outside Python" in str(err)
    assert_none_left()


def test_ctrl_c_in_join_stops_a_join_false_call(tmp_path):
    def busy(i, folder):
        _started(folder, i)
        while True:
            sum(range(1000))

    context = ppkit.spawn(busy, args=(tmp_path,), nprocs=2, join=False)
    _interrupt_when_started(tmp_path, 2)
    with pytest.raises(ppkit.JobInterrupted, match="Every process of this call has been stopped"):
        context.join()
    assert_none_left()


def test_what_cannot_be_pickled_is_named():
    lock = threading.Lock()

    def uses(i, size, thing):
        pass

    def closes_over(i):
        lock.acquire()

    with pytest.raises(ppkit.ConfigError, match=r"ppkit.spawn cannot send args\[1\] \(lock\) to the new "
                                                r"processes: cannot pickle '_thread.lock' object"):
        ppkit.spawn(uses, args=(2, lock), nprocs=2)
    with pytest.raises(ppkit.ConfigError, match=r"cannot send closes_over \(function\) to the new processes"):
        ppkit.spawn(closes_over, nprocs=2)
    assert_none_left()


def all_reduce_on(i, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_taken_fixed_port_says_which_and_what_to_do(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if sys.platform.startswith("linux"):  # in their private network the port is free (docs/isolation.md)
            ppkit.spawn(all_reduce_on, args=(port,), nprocs=2, timeout=60)
        monkeypatch.setenv("PPKIT_ISOLATION", "off")  # on the machine's loopback it is taken
        spawn_call.close()
        try:
            with pytest.raises(ppkit.ProcessRaisedError) as info:
                ppkit.spawn(hang_in_recv, args=(port,), nprocs=2, timeout=60)
        finally:
            spawn_call.close()
    err = info.value
    assert err.error_index == 0 and err.exc_types[0] == "DistNetworkError"
    assert f"port {port} on this machine is already in use, so rank 0 cannot host the rendezvous store" in str(err)
    assert "Pick another port" in str(err)
    assert_none_left()


RPC_CELL = """
import os
import torch
from torch.distributed import rpc

def add(a, b):  # called by RPC on the other process, which cannot import it by name
    return a + b

def rpc_worker(i, world_size, port):
    os.environ.update(MASTER_ADDR="localhost", MASTER_PORT=str(port))
    rpc.init_rpc(f"worker{i}", rank=i, world_size=world_size)
    if i == 0:
        print("sum:", rpc.rpc_sync("worker1", add, args=(torch.ones(2), 1)).tolist())
    rpc.shutdown()
"""


@pytest.mark.slow
def test_rpc_sends_a_cells_functions_by_value_on_a_fixed_port(capsys):
    cell = {"__name__": "__main__"}  # as IPython runs a cell: the functions belong to __main__
    exec(compile(RPC_CELL, "<cell>", "exec"), cell)
    port = free_port()
    for _ in range(2):
        ppkit.spawn(cell["rpc_worker"], args=(2, port), nprocs=2, timeout=120)
        assert "[rank 0] sum: [2.0, 2.0]" in capsys.readouterr().out
    assert_none_left()


@pytest.mark.slow
def test_a_multiprocessing_queue_in_args_is_refused_with_what_to_do_instead():
    import torch.multiprocessing as mp

    with pytest.raises(ppkit.ConfigError, match=r"cannot send args\[0\] \(SimpleQueue\).*not children of this "
                                                r"kernel\): to get results back, write them to files"):
        ppkit.spawn(two_args, args=(mp.get_context("spawn").SimpleQueue(),), nprocs=1)


BAD = [
    (dict(fn=None), r"ppkit.spawn needs the function each process runs, fn\(i, \*args\), got NoneType"),
    (dict(args=2), r"args must be a tuple of the arguments after i, got int 2. Write args=\(world_size,\)"),
    (dict(nprocs=0), r"nprocs must be a whole number of processes, at least 1, got 0"),
    (dict(nprocs=True), r"nprocs must be a whole number of processes, at least 1, got True"),
    (dict(start_method="threads"), r"unknown start_method 'threads'; the choices are 'auto', 'forkserver'"),
    (dict(timeout=float("nan")), r"timeout must be None \(no limit\) or a positive number of seconds, got nan"),
    (dict(args=(1, 2)), r"two_args cannot be called as two_args\(i, \*args\) with args=\(1, 2\): too many "
                        r"positional arguments. mp.spawn and ppkit.spawn pass the process index first"),
]


def two_args(rank, world_size):
    pass


@pytest.mark.parametrize("bad, message", BAD)
def test_bad_arguments_are_refused_before_anything_starts(bad, message, monkeypatch):
    monkeypatch.setattr(spawn_call, "_fresh_cluster", lambda key: pytest.fail("started before checking"))
    options = {"fn": two_args, "args": (2,), "nprocs": 2, **bad}
    with pytest.raises(ppkit.ConfigError, match=message):
        ppkit.spawn(options.pop("fn"), **options)
