"""How a ppkit.spawn process ends, as under mp.spawn and torchrun: when ``fn`` returns its process
ends through the interpreter's own exit (non-daemon threads joined, atexit handlers run) and is gone
at once; an exit with status 0 however it comes is a success; there is no time limit by default,
and a run that hangs is shown once with where each process waits, and goes on."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

import pytest
from test_spawn import _close_fork_servers, assert_none_left, hang_in_recv  # noqa: F401 - a fixture, here too

import ppkit
from ppkit.cluster.hang_watch import waits_on_peers
from ppkit.lessons.data_parallel import free_port


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_atexit_handlers_and_non_daemon_threads_run_when_fn_returns(tmp_path, method):
    def main(i, folder):
        def write_later():
            time.sleep(0.5)  # still running when fn returns: the process waits for it
            (folder / f"thread-{i}").write_text("written after fn returned")

        atexit.register(lambda: (folder / f"atexit-{i}").write_text("flushed at exit"))
        threading.Thread(target=write_later).start()  # not a daemon
        print(f"fn of {i} returns", flush=True)

    ppkit.spawn(main, args=(tmp_path,), nprocs=2, start_method=method)
    assert sorted(os.listdir(tmp_path)) == ["atexit-0", "atexit-1", "thread-0", "thread-1"]
    assert (tmp_path / "atexit-1").read_text() == "flushed at exit"
    assert_none_left()


def test_os_exit_0_is_a_success_and_what_was_printed_before_it_arrives(capsys):
    def main(i):
        print(f"last words of {i}", flush=True)
        os._exit(0)

    ppkit.spawn(main, nprocs=2)
    out = capsys.readouterr().out
    assert "[rank 0] last words of 0" in out and "[rank 1] last words of 1" in out
    assert_none_left()


def test_a_process_that_is_done_is_gone_while_the_others_still_run(tmp_path):
    def main(i, folder):
        if i == 1:
            sys.exit(0)  # done early: its process ends now, not when the call does
        deadline = time.monotonic() + 30
        pid = None
        while pid is None and time.monotonic() < deadline:
            found = list(folder.glob("pid-1"))
            pid = int(found[0].read_text()) if found and found[0].read_text() else None
            time.sleep(0.05)
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                (folder / "seen").write_text("process 1 was gone while process 0 still ran")
                return
            time.sleep(0.05)

    done = ppkit.spawn(main, args=(tmp_path,), nprocs=2, join=False)
    (tmp_path / "pid-1").write_text(str(done.pids()[1]))
    assert done.join(timeout=60)
    assert (tmp_path / "seen").read_text() == "process 1 was gone while process 0 still ran"
    assert_none_left()


def test_a_hang_is_shown_once_with_where_each_waits_and_the_run_goes_on(monkeypatch, capsys):
    monkeypatch.setenv("PPKIT_HANG_S", "2")
    started = time.monotonic()
    with pytest.raises(ppkit.JobTimeoutError):  # the test's own limit; without it the run would go on
        ppkit.spawn(hang_in_recv, args=(free_port(),), nprocs=2, timeout=12)
    assert time.monotonic() - started >= 12
    out = capsys.readouterr().out
    assert out.count("[ppkit] possibly hung: for 2 s no rank printed or finished") == 1, out
    assert "rank(s) [0, 1] each wait inside torch.distributed" in out
    assert "dist.recv(torch.zeros(1), src=1)" in out and "dist.barrier()" in out
    assert "in _call_rank" not in out  # ppkit's own frames are left out
    assert_none_left()


def test_a_process_that_computes_without_printing_is_not_called_hung(monkeypatch, capsys):
    def compute(i):
        ends = time.monotonic() + 4
        while time.monotonic() < ends:
            sum(range(1000))

    monkeypatch.setenv("PPKIT_HANG_S", "1")
    ppkit.spawn(compute, nprocs=2)
    assert "possibly hung" not in capsys.readouterr().out
    assert_none_left()


def test_there_is_no_time_limit_by_default_and_a_bad_one_is_refused():
    import inspect

    assert inspect.signature(ppkit.spawn).parameters["timeout"].default is None
    assert inspect.signature(ppkit.torchrun).parameters["timeout"].default is None
    with pytest.raises(ppkit.ConfigError, match=r"timeout must be None \(no limit\) or a positive number of seconds, "
                                                r"got -1"):
        ppkit.spawn(lambda i: None, nprocs=1, timeout=-1)


def test_a_stack_in_torch_distributed_waits_on_peers_and_one_in_own_code_does_not():
    waiting = ('  File "/x/train.py", line 9, in main\n    dist.all_reduce(t)\n'
               '  File "/v/site-packages/torch/distributed/distributed_c10d.py", line 3, in all_reduce\n'
               '    work.wait()\n')
    computing = '  File "/x/train.py", line 9, in main\n    loss = model(x)\n'
    assert waits_on_peers(waiting) and not waits_on_peers(computing) and not waits_on_peers("(no answer)")


def test_after_a_failure_the_others_get_sigterm_first_as_under_torchrun(tmp_path):
    def main(i, folder):
        if i == 1:
            time.sleep(1)
            raise ValueError("rank 1 fails")

        def on_sigterm(signum, frame):
            (folder / "sigterm-0").write_text("rank 0 was asked to stop")
            os._exit(143)

        signal.signal(signal.SIGTERM, on_sigterm)
        time.sleep(60)

    with pytest.raises(ppkit.ProcessRaisedError, match="raised ValueError: rank 1 fails"):
        ppkit.spawn(main, args=(tmp_path,), nprocs=2)
    assert (tmp_path / "sigterm-0").read_text() == "rank 0 was asked to stop"
    assert_none_left()
