"""A learner's own training run in a cell, as under torchrun (issue 39), in a real Jupyter kernel:
as long as it takes, exits as torchrun counts them, atexit and non-daemon threads at the end, and
``%debug`` in the rank that raised. One kernel serves every scenario; the module's end checks that no
ppkit process outlives it."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import psutil
import pytest
from kernels import kernel_after, kernel_in
from test_debugger import run_cell
from test_rank_network import BODY, url  # noqa: F401 - url: an HTTP server on this machine's own address

pytestmark = pytest.mark.slow

START = """
import os, sys, time
import ppkit
%load_ext ppkit
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with kernel_after(tmp_path_factory.mktemp("notebook"), START, run_cell) as kernel:
        yield kernel


def test_a_75_s_torchrun_cell_without_timeout_runs_to_its_end(kernel):
    _, kc = kernel
    started = time.monotonic()
    cell = run_cell(kc, """
        %%torchrun --nproc-per-node 2
        import os, time
        for minute_part in range(5):
            time.sleep(15)
            print(f"rank {os.environ['RANK']} at {15 * (minute_part + 1)} s", flush=True)
        """)
    assert cell.error is None, cell.text
    assert time.monotonic() - started >= 75
    assert re.search(r"rank 0(…1)? at 75 s", cell.text) and re.search(r"rank (0…)?1 at 75 s", cell.text), cell.text


def test_sys_exit_0_early_and_os_exit_0_at_the_end_are_successes(kernel):
    _, kc = kernel
    cell = run_cell(kc, """
        %%torchrun --nproc-per-node 2
        import os, sys
        if os.environ["RANK"] == "1":
            print("rank 1 is done early", flush=True)
            sys.exit(0)
        print("rank 0 ends with os._exit(0)", flush=True)
        os._exit(0)
        """)
    assert cell.error is None, cell.text
    assert "rank 1 is done early" in cell.text and "rank 0 ends with os._exit(0)" in cell.text


def test_atexit_handlers_and_a_non_daemon_thread_run_after_main_returns(kernel, tmp_path):
    _, kc = kernel
    cell = run_cell(kc, f"""
        %%torchrun --nproc-per-node 2
        import atexit, os, threading, time
        folder = {str(tmp_path)!r}
        rank = os.environ["RANK"]

        def save_checkpoint():  # an async checkpoint's writer, still busy when main() returns
            time.sleep(1)
            open(os.path.join(folder, f"checkpoint-{{rank}}"), "w").write("saved")

        def main():
            atexit.register(lambda: open(os.path.join(folder, f"atexit-{{rank}}"), "w").write("flushed"))
            threading.Thread(target=save_checkpoint).start()

        if __name__ == "__main__":
            main()
        """)
    assert cell.error is None, cell.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit-0", "atexit-1", "checkpoint-0", "checkpoint-1"]


def test_a_non_zero_exit_ends_the_run_and_names_the_rank_and_its_code(kernel):
    _, kc = kernel
    started = time.monotonic()
    cell = run_cell(kc, """
        %%torchrun --nproc-per-node 2
        import os, time
        if os.environ["RANK"] == "1":
            os._exit(7)
        time.sleep(60)  # rank 0 would go on: the run ends when rank 1 fails
        """)
    assert cell.error is not None and cell.error[0] == "ProcessExitedError", cell.text
    assert "rank 1 of 2" in cell.error[1] and "exited with code 7" in cell.error[1]
    assert time.monotonic() - started < 30


def test_debug_after_a_torchrun_error_opens_pdb_in_the_rank_with_its_locals(kernel):
    _, kc = kernel
    cell = run_cell(kc, """
        %%torchrun --nproc-per-node 2
        import os
        def step(batch):
            learning_rate = 0.1 * (int(os.environ["RANK"]) + 1)
            if os.environ["RANK"] == "1":
                raise ValueError(f"loss is nan at lr {learning_rate}")
            return batch
        step(3)
        """)
    assert cell.error is not None and cell.error[0] == "ProcessRaisedError", cell.text
    cell = run_cell(kc, "%debug", answers=["p learning_rate * 100", "w", "u", "q"])
    assert cell.error is None, cell.text
    assert "post-mortem on rank 1: ValueError: loss is nan at lr 0.2" in cell.text
    assert "20.0" in cell.text and "(Pdb rank 1)" in " ".join(cell.prompts)
    assert "<%%torchrun cell" in cell.text and "step(3)" in cell.text  # w: the cell's frames
    for ours in ("run_as_rank", "_call_rank", "_run_job", "_run_target"):  # ppkit's own frames stay out
        assert ours not in cell.text, cell.text
    # the kept rank is gone once the cell after the failing one ended
    late = run_cell(kc, "%debug")
    assert "the process that raised is gone" in late.text, late.text


def fork_servers(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)
            if "ppkit.transport.zygote" in " ".join(p.cmdline())]


def test_import_ppkit_in_a_kernel_prestarts_the_fork_server_and_in_a_script_does_not(tmp_path):
    with kernel_in(tmp_path) as (fresh, fresh_kc):
        cell = run_cell(fresh_kc, "import ppkit")  # no %load_ext, no call yet
        assert cell.error is None, cell.text
        deadline = time.monotonic() + 60
        while not fork_servers(fresh.provisioner.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fork_servers(fresh.provisioner.process.pid), "import ppkit in a kernel started no fork server"
        cell = run_cell(fresh_kc, "ppkit.spawn(lambda i: print('ran on', i), nprocs=2)")
        assert cell.error is None and "ran on 1" in cell.text, cell.text
    script = tmp_path / "script.py"
    script.write_text("import os, time, psutil, ppkit\ntime.sleep(3)\n"
                      "print([' '.join(p.cmdline()) for p in psutil.Process().children(recursive=True)])\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_pdb_Pdb_set_trace_on_a_rank_works_as_breakpoint_does_without_ppkit_frames(kernel):
    # --no-collapse: each rank's line as it printed it (collapsed, the two lines of one shape may fold into one)
    _, kc = kernel
    cell = run_cell(kc, """
        %%torchrun --nproc-per-node 2 --no-collapse
        import os, pdb
        secret = 40 + int(os.environ["RANK"])
        if os.environ["RANK"] == "1":
            pdb.Pdb().set_trace()
        print("after the breakpoint", secret, flush=True)
        """, answers=["p secret + 1", "w", "c"])
    assert cell.error is None, cell.text
    assert "(Pdb rank 1)" in " ".join(cell.prompts) and "42" in cell.text
    assert "after the breakpoint 41" in cell.text and "after the breakpoint 40" in cell.text
    for ours in ("run_as_rank", "_call_rank", "_run_job", "_run_target"):
        assert ours not in cell.text, cell.text


def test_a_rank_fetches_from_this_machines_own_address_as_the_kernel_can(kernel, url):  # noqa: F811 - the fixture
    _, kc = kernel
    cell = run_cell(kc, f"""
        %%torchrun --nproc-per-node 2
        import os, urllib.request
        with urllib.request.urlopen({url + "rank-"!r} + os.environ["RANK"], timeout=30) as answer:
            print("fetched", answer.read().decode(), flush=True)
        """)
    assert cell.error is None, cell.text
    assert f"fetched {BODY.decode()}" in cell.text
    assert sorted(url.asked[-2:]) == ["/rank-0", "/rank-1"]
