"""The progress record in a real Jupyter kernel, as a learner's notebook writes it: a ``workbook.check``
that passes and one that fails, a ppkit error raised in a cell, a ``ppkit.spawn`` that ends well and one
whose rank exits with code 7, a ``%%torchrun`` cell that hangs until its timeout; each in the record with
the notebook's name from JPY_SESSION_NAME (which jupyter_server sets for a notebook's kernel). One kernel
serves every step; PPKIT_RECORD_DIR: tmp."""

from __future__ import annotations

import threading
import time

import pytest
from kernels import kernel_in
from test_debugger import run_cell

from ppkit.progress import format as fmt
from ppkit.progress import read
from ppkit.room.progress_fetch import Fetched
from ppkit.room.progress_rows import row_of

pytestmark = pytest.mark.slow

NOTEBOOK = "course/02_collectives.ipynb"

START = """
import importlib, os
import ppkit
importlib.reload(ppkit)  # ppkit imported again, and as an extension: the cell hook is still registered once
%load_ext ppkit
from ppkit.exercises import solutions, workbook
from ppkit.progress import hooks
print(os.getpid(), sum(c is hooks._after_cell for c in get_ipython().events.callbacks["post_run_cell"]))
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("record") / "ppkit-progress"
    with pytest.MonkeyPatch.context() as env:  # the kernel inherits this environment
        env.setenv(fmt.DIR_ENV, str(folder))
        env.setenv("JPY_SESSION_NAME", NOTEBOOK)
        env.delenv(fmt.SWITCH_ENV, raising=False)
        env.setenv("PPKIT_HANG_S", "2")  # the hang watch looks after 2 s of silence, not 60
        with kernel_in(tmp_path_factory.mktemp("notebook"), expect_processes=True) as (km, kc):
            cell = run_cell(kc, START)
            assert cell.error is None, cell.text
            pid, hooks_registered = map(int, cell.text.split())
            assert hooks_registered == 1
            yield kc, folder, pid, km


def new_events(folder, since: int) -> list:
    return read.read_folder(folder).events[since:]


def test_checks_and_errors_of_cells_land_in_the_record_with_the_notebook(kernel):
    kc, folder, pid, _ = kernel
    seen = len(read.read_folder(folder).events)
    assert run_cell(kc, 'workbook.check("my_share", solutions.my_share)').error is None
    failed = run_cell(kc, """
        def my_share(rank, world_size, num_items):
            return list(range(num_items)) if rank == 0 else []
        workbook.check("my_share", my_share)
    """)
    assert failed.error[0] == "ExerciseFailed"
    wrong = run_cell(kc, "ppkit.spawn(print, nprocs=0)")
    assert wrong.error[0] == "ConfigError"
    events = new_events(folder, seen)
    # the failed check once, as a failed check: not a second time as the ExerciseFailed its cell raised
    assert [(e.kind, e.fields.get("status") or e.fields.get("error")) for e in events] == [
        ("check", "passed"), ("check", "failed"), ("error", "ConfigError")]
    assert all(e.notebook == NOTEBOOK and e.pid == pid for e in events)
    reason = events[1].fields["reason"]
    header, first_problem = failed.error[1].splitlines()[:2]  # "my share: 12 problem(s) in 5 cases:", "  - ..."
    assert reason == f"{header} {first_problem.strip()}", reason
    assert events[2].fields["message"] == wrong.error[1].splitlines()[0]


def test_a_spawn_that_ends_well_and_one_whose_rank_exits_7(kernel):
    kc, folder, pid, _ = kernel
    seen = len(read.read_folder(folder).events)
    assert run_cell(kc, """
        def fine(i):
            pass
        ppkit.spawn(fine, nprocs=2)
    """).error is None
    died = run_cell(kc, """
        def exits_7(i):
            import sys
            if i == 1:
                sys.exit(7)
        ppkit.spawn(exits_7, nprocs=2)
    """)
    assert died.error[0] == "ProcessExitedError"
    events = new_events(folder, seen)
    assert [(e.kind, e.fields.get("state") or e.fields.get("error"), e.fields.get("detail")) for e in events] == [
        ("cluster", "running", "ppkit.spawn: 2 rank(s) started"),
        ("cluster", "finished", "ppkit.spawn: all 2 rank(s) finished"),
        ("cluster", "running", "ppkit.spawn: 2 rank(s) started"),
        ("cluster", "died", "ppkit.spawn: rank 1 exited with code 7"),
        ("error", "ProcessExitedError", None)]
    assert all(e.notebook == NOTEBOOK and e.pid == pid for e in events)
    summary = read.read_folder(folder).notebooks
    assert [b.notebook for b in summary] == [NOTEBOOK]
    assert summary[0].last_cluster.state == "died" and summary[0].last_error.error == "ProcessExitedError"


def test_a_torchrun_cell_that_hangs_is_recorded_hung_then_died(kernel):
    kc, folder, pid, _ = kernel
    seen = len(read.read_folder(folder).events)
    hung = run_cell(kc, """
        %%torchrun --nproc-per-node 2 --timeout 8
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        dist.recv(torch.zeros(1), src=1 - int(os.environ["RANK"]))  # each rank waits for the other: a deadlock
    """)
    assert hung.error[0] == "JobTimeoutError" and "possibly hung" in hung.text
    events = new_events(folder, seen)
    assert [(e.kind, e.fields.get("state") or e.fields.get("error")) for e in events] == [
        ("cluster", "running"), ("cluster", "hung"), ("cluster", "died"), ("error", "JobTimeoutError")]
    running, stuck, died, _ = events
    assert running.fields["detail"] == "%%torchrun: 2 rank(s) started"
    assert 2.0 <= stuck.fields["seconds"] < 8.0
    assert stuck.fields["detail"].startswith("every rank waits on its peers (stack or flight record): rank 0 in ")
    assert ", rank 1 in " in stuck.fields["detail"]
    assert died.fields["detail"].startswith("%%torchrun: JobTimeoutError: ")
    assert all(e.notebook == NOTEBOOK and e.pid == pid for e in events)


def test_a_hung_run_she_interrupts_is_stopped_and_the_room_does_not_call_her_stuck(kernel):
    """What the hang message tells her to do: Kernel > Interrupt (the kernel's SIGINT, as JupyterLab sends it)."""
    kc, folder, pid, km = kernel
    seen = len(read.read_folder(folder).events)
    done = threading.Event()

    def interrupt_once_hung():  # not after a fixed time: on a loaded machine the ranks may start later than that
        while not done.wait(0.2):
            if any(e.fields.get("state") == "hung" for e in new_events(folder, seen)):
                km.interrupt_kernel()
                return

    interrupt = threading.Thread(target=interrupt_once_hung, daemon=True)
    interrupt.start()
    try:
        hung = run_cell(kc, """
            %%torchrun --nproc-per-node 2 --timeout 120
            import os, torch, torch.distributed as dist
            dist.init_process_group("gloo")
            dist.recv(torch.zeros(1), src=1 - int(os.environ["RANK"]))  # each rank waits for the other: a deadlock
        """)
    finally:
        done.set()
        interrupt.join()
    assert hung.error[0] == "JobInterrupted" and "possibly hung" in hung.text, (hung.error, hung.text[-2000:])
    events = new_events(folder, seen)
    assert [(e.kind, e.fields.get("state")) for e in events] == [
        ("cluster", "running"), ("cluster", "hung"), ("cluster", "stopped")], events
    assert events[-1].fields["detail"] == "%%torchrun: stopped by Kernel > Interrupt"
    texts = {name: (folder / name).read_text() if (folder / name).exists() else None
             for name in (fmt.OLD, fmt.CURRENT)}
    row = row_of(Fetched("ana", "running", texts=texts, sessions=[{"path": NOTEBOOK, "kernel": {
        "execution_state": "idle"}}], now=time.time()), stuck_after=0)
    assert not [s for s in row.stuck if s.startswith("cluster")], row.stuck
