"""The collective doctor as runs use it, in a real Jupyter kernel: ppkit.spawn, %%torchrun, %%ranks
(its hang watch, Kernel > Interrupt, on demand afterwards), what a rank that ended says, gloo's own
words, a rank's error shown once, SIGINT in ranks, and torch's dump files for fr_trace.

One kernel serves the cases (kernel and fork server cost seconds to start); each case is one short cell.
The SIGINT cases need kernels of their own: what they test is how a kernel's first fork server starts.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest
from kernels import kernel_in
from test_debugger import run_cell

from ppkit.cluster.hang_doctor.call_compare import KINDS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

START = """
import os, sys, time, signal, threading
import torch, torch.distributed as dist
import ppkit
from ppkit.lessons.data_parallel import free_port
%load_ext ppkit

def join(i, n=2):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["DOCTOR_PORT"])
    dist.init_process_group("gloo", rank=i, world_size=n)

def spawn(fn, n=2, timeout=9):
    os.environ["DOCTOR_PORT"] = str(free_port())
    try:
        ppkit.spawn(fn, args=(n,), nprocs=n, timeout=timeout)
    except ppkit.WorkerError as exc:
        print(type(exc).__name__, exc)
print("ready")
"""
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:  # the kernel inherits this environment
        env.setenv("PPKIT_HANG_S", "2")
        with kernel_in(tmp_path_factory.mktemp("doctor_runs"), expect_processes=True) as (km, kc):
            cell = run_cell(kc, START)
            assert cell.error is None and "ready" in cell.text, cell.text
            yield km, kc


@pytest.fixture
def kc(kernel):
    return kernel[1]


def spawned(kc, body: str, n: int = 2, timeout: int = 9) -> str:
    """The cell's text after ``spawn(case)`` of a ``case(i, n)`` whose body is ``body`` (after join(i, n))."""
    cell = run_cell(kc, "def case(i, n):\n    join(i, n)\n" + "".join(f"    {line}\n" for line in body.splitlines())
                    + f"spawn(case, {n}, {timeout})\n")
    assert cell.error is None, cell.text
    return cell.text


def test_a_ddp_rank_that_ends_one_step_early_is_a_failed_collective_and_the_doctor_says_so(kc):
    """DDP's error comes from autograd (no torch/distributed frame): gloo's "Connection closed by peer"."""
    text = spawned(kc, "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                       "model = DDP(torch.nn.Linear(4, 1))\n"
                       "for step in range(3 if i == 0 else 2):\n"
                       "    model(torch.ones(2, 4)).sum().backward()", timeout=90)  # DDP imports torch._dynamo
    assert "ProcessRaisedError" in text, text
    assert "collective doctor" in text, text
    assert "is not reached by every rank" in text, text
    assert "rank 1 has not reached it: it finished its job and its process ended" in text, text


def test_ranks_that_made_the_call_and_ended_are_not_said_to_have_not_reached_it(kc):
    """4 ranks, a reduce_scatter_tensor whose sizes are smaller on rank 3: rank 3 gets wrong data and ends,
    the others fail when it is gone. Its final record says it made the call."""
    text = spawned(kc, "out = torch.zeros(2 if i != 3 else 1)\n"
                       "dist.reduce_scatter_tensor(out, torch.ones(8 if i != 3 else 4))\n"
                       "print('out', out.tolist())", n=4, timeout=30)
    assert "[rank 3] out" in text, text  # it ended normally
    assert "rank 3 has not reached it" not in text, text
    assert "collective #1 does not match: the sizes differ" in text, text
    assert "rank 3: reduce_scatter_tensor (gloo records all_reduce #1) of [4] Float" in text, text  # both names


def test_a_rank_that_leaves_through_os_exit_sends_its_record_and_is_said_to_have_exited(kc):
    text = spawned(kc, "t = torch.ones(4)\ndist.all_reduce(t)\nif i == 1:\n    os._exit(0)\ndist.all_reduce(t)",
                   timeout=30)
    assert "collective #2 is not reached by every rank" in text, text  # its record: it completed #1 only
    assert "rank 1 has not reached it: its process exited with status 0 before its job returned" in text, text


def test_a_rank_that_leaves_through_sys_exit_0_is_said_to_have_done_so(kc):
    text = spawned(kc, "t = torch.ones(4)\ndist.all_reduce(t)\nif i == 1:\n    sys.exit(0)\ndist.all_reduce(t)",
                   n=3, timeout=30)
    assert "collective #2 is not reached by every rank" in text, text
    assert "rank 1 has not reached it: it exited through sys.exit (status 0) and its process ended" in text, text


def test_a_rank_without_a_record_is_said_to_have_none_not_to_have_not_reached_it():
    from ppkit.cluster.hang_doctor import diagnose

    call = {"group": "0", "desc": "default_pg", "seq": 1, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
            "peer": None, "backend": "gloo", "profiling_name": "gloo:all_reduce", "input_sizes": [[4]],
            "output_sizes": [[4]], "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "scheduled",
            "done": False, "time_created_ns": 1, "at": {}}
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1]}}
    text = str(diagnose({0: {"calls": [call], "groups": groups, "p2p": None}}, 2,
                        {1: "it finished its job and its process ended"}))
    assert "rank 1 has not reached it" not in text, text
    assert ("rank 1: no record: it finished its job and its process ended; whether it called collective #1 is "
            "not known") in text, text


def test_the_learners_own_error_with_glooss_words_is_not_a_failed_collective(kc):
    """Rank 0's own OSError (a download failing) says "Connection closed by peer": #1 still completed on both
    ranks, and rank 0 raised before #2. The stack where rank 1 waits shows no ppkit frame (the recorder's wrapper
    of Work.wait)."""
    text = spawned(kc, "t = torch.ones(4)\ndist.all_reduce(t)\nif i == 0:\n"
                       "    raise OSError('downloading shard 3: Connection closed by peer')\ndist.all_reduce(t)",
                   timeout=30)
    assert "raised OSError: downloading shard 3" in text, text
    assert "every rank that answered completed collective #1" in text, text
    assert "collective #2 is not reached by every rank" in text, text
    assert "rank 0 has not reached it: it raised OSError" in text, text
    assert "ppkit/" not in text, text  # flight_calls.py's wait, in rank 1's stack


def test_on_demand_after_a_later_run_succeeded_the_doctor_does_not_call_the_failed_one_the_last(kc):
    cell = run_cell(kc, "def bad(i, n):\n    join(i, n)\n    if i == 0:\n        raise ValueError('bad run')\n"
                        "    dist.all_reduce(torch.ones(4))\nspawn(bad, 2, 30)\n"
                        "print('after the failed run:', ppkit.collective_doctor())\n"
                        "def good(i, n):\n    join(i, n)\n    dist.all_reduce(torch.ones(4))\nspawn(good, 2, 30)\n"
                        "d = ppkit.collective_doctor()\nprint('problem', d.problem)\nprint(d)")
    assert cell.error is None, cell.text
    failed, good = cell.text.split("problem ")
    assert good.startswith("False"), cell.text
    assert "the last ppkit.spawn run ended without error" in good, cell.text
    assert "collective #" not in good and "every collective" not in good, cell.text
    assert "(the records of the last ppkit.spawn run, which failed; read as it ended, not now)" in failed, cell.text


def test_the_learners_line_is_shown_as_ipython_names_the_cell(kc):
    text = spawned(kc, "t = torch.ones(4)\ndist.all_reduce(t)\n"
                       "dist.all_reduce(t) if i == 0 else dist.broadcast(t, src=0)")
    assert "does not match: the op differs" in text, text
    assert re.search(r"called at Cell In\[\d+\], line 5: dist.all_reduce\(t\) if i == 0", text), text
    assert not re.search(r"called at [^,]*ipykernel_", text), text  # not the kernel's temporary file
    assert "ipykernel_" not in text, text  # nor in the ranks' stacks
    assert re.search(r"^  Cell In\[\d+\], line 5, in case$", text, re.MULTILINE), text


def test_a_cluster_runs_timeout_names_the_cell_in_each_ranks_stack_as_the_doctor_does(kc):
    """Review 52b, case C1: the timeout's stacks named the kernel's temporary file, the doctor 'Cell In[5]'."""
    cell = run_cell(kc, "def stuck(rank, world_size):\n    import torch, torch.distributed as dist\n"
                        "    if rank == 0:\n        dist.all_reduce(torch.ones(1))\n"
                        "    else:\n        dist.recv(torch.zeros(1), src=0)\n"
                        "with ppkit.Cluster(2, 'gloo', timeout=60) as cl:\n    try:\n        cl.run(stuck, timeout=6)\n"
                        "    except ppkit.JobTimeoutError as exc:\n        print('TIMEOUT', exc)\n")
    assert cell.error is None and "TIMEOUT" in cell.text, cell.text
    stacks = cell.text.split("TIMEOUT", 1)[1]
    assert re.search(r"^  Cell In\[\d+\], line 4, in stuck$", stacks, re.MULTILINE), stacks
    assert re.search(r"^  Cell In\[\d+\], line 6, in stuck$", stacks, re.MULTILINE), stacks
    assert "ipykernel_" not in cell.text, cell.text


def test_the_learners_line_is_shown_under_torchrun(kc):
    cell = run_cell(kc, "%%torchrun --nproc-per-node 2 --timeout 9\nimport torch, torch.distributed as dist\n"
                        "dist.init_process_group('gloo')\nt = torch.ones(4)\n"
                        "dist.all_reduce(t) if dist.get_rank() == 0 else dist.broadcast(t, src=0)\n")
    text = cell.text + str(cell.error)
    assert "collective #1 does not match: the op differs" in text, text
    assert re.search(r"called at %%torchrun cell \d+, line 4: dist.all_reduce\(t\) if dist.get_rank\(\) == 0",
                     text), text


def test_a_rank_killed_by_a_signal_is_said_to_have_no_record_and_the_others_call_not_to_have_completed(kc):
    """3 ranks under %%torchrun; rank 1 dies by SIGSEGV after #1 while ranks 0 and 2 call #2. gloo retires their
    failed #2 as if it completed: only their errors say it did not."""
    cell = run_cell(kc, "%%torchrun --nproc-per-node 3 --timeout 40\n"
                        "import os, signal, torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                        "t = torch.ones(4); dist.all_reduce(t)\n"
                        "if dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGSEGV)\ndist.all_reduce(t)\n")
    text = cell.text + str(cell.error)
    assert cell.error is not None and cell.error[0] == "ProcessExitedError", text
    assert "every collective each rank started has completed" not in text, text
    assert "every rank that answered completed collective #1" in text, text
    assert "collective #2 has not completed on every rank" in text, text
    assert ("rank 1: no record: it was killed by signal SIGSEGV; whether it called collective #2 is not known"
            in text), text


def test_on_demand_a_rank_whose_job_raised_is_said_to_have_raised(kc):
    assert run_cell(kc, "cluster = ppkit.start(2)").error is None
    cell = run_cell(kc, "%%ranks --timeout 20\nt = torch.ones(4)\nif rank == 0:\n    raise ValueError('no')\n"
                        "dist.all_reduce(t)\n")
    assert cell.error is not None and cell.error[0] == "RemoteError", cell.text
    again = run_cell(kc, "print(ppkit.collective_doctor())")
    assert again.error is None, again.text
    assert "still computing" not in again.text, again.text
    assert "rank 0 has not reached it: its last job raised ValueError" in again.text, again.text
    assert run_cell(kc, "cluster.close()").error is None


def test_ranks_has_a_hang_watch(kc):
    assert run_cell(kc, "cluster = ppkit.start(2)").error is None
    cell = run_cell(kc, "%%ranks --timeout 12\nt = torch.ones(4)\n"
                        "dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0)\n")
    assert cell.error is not None and cell.error[0] == "JobTimeoutError", cell.text
    assert "possibly hung" in cell.text, cell.text
    assert cell.text.index("possibly hung") < cell.text.index("collective #1 does not match"), cell.text
    assert cell.text.count("collective #1 does not match") == 1, cell.text  # the timeout's reading is the same
    assert "the records read as they did when the hang watch showed them above" in cell.text, cell.text
    assert run_cell(kc, "cluster.close()").error is None


def test_kernel_interrupt_runs_the_doctor(kernel):
    """Interrupted twice: the second, while the doctor reads (held back 4 s here), does not cut its reading."""
    km, kc = kernel
    assert run_cell(kc, "os.environ['PPKIT_HANG_S'] = '0'\ncluster = ppkit.start(2)\n"
                        "from ppkit.cluster import jobs\nask = jobs.hang_doctor.ask_records\n"
                        "jobs.hang_doctor.ask_records = lambda *a, **k: (time.sleep(4), ask(*a, **k))[1]").error is None
    timers = [threading.Timer(8.0, km.interrupt_kernel), threading.Timer(10.0, km.interrupt_kernel)]
    [timer.start() for timer in timers]
    try:
        cell = run_cell(kc, "%%ranks --timeout 60\nt = torch.ones(4)\n"
                            "dist.all_reduce(t) if rank == 0 else dist.broadcast(t, src=0)\n")
    finally:
        [timer.cancel() for timer in timers]
        run_cell(kc, "os.environ['PPKIT_HANG_S'] = '2'\njobs.hang_doctor.ask_records = ask")
    assert cell.error is not None and cell.error[0] == "JobInterrupted", cell.text
    assert "possibly hung" not in cell.text, cell.text
    assert "collective #1 does not match: the op differs" in cell.text, cell.text
    assert "rank 0: all_reduce #1 of [4] Float" in cell.text and "rank 1: broadcast #1 of [4] Float" in cell.text
    assert "interrupted again: the collective doctor reads the ranks' records first" in cell.text, cell.text
    shown = ANSI.sub("", cell.traceback)
    assert "During handling of the above exception" not in shown, shown  # JobInterrupted alone
    assert "ppkit/" not in shown, shown  # nor ppkit's frames in where each rank waits
    assert run_cell(kc, "cluster.close()").error is None


def test_kernel_interrupt_while_torchruns_ranks_start_says_so_and_the_next_run_works(kernel):
    """The processes' start is held back here (as on a loaded machine) so that the interrupt lands in it."""
    km, kc = kernel
    slow = run_cell(kc, "from ppkit.cluster.spawn import call as spawn_call\nstart = spawn_call._start\n"
                        "spawn_call._start = lambda key: (time.sleep(60), start(key))[1]")
    assert slow.error is None, slow.text
    timer = threading.Timer(4.0, km.interrupt_kernel)
    timer.start()
    source = "%%torchrun --nproc-per-node 3 --timeout 30\nprint('ran')\n"  # 3: not the kept 2-process server
    try:
        cell = run_cell(kc, source)
    finally:
        timer.cancel()
        run_cell(kc, "spawn_call._start = start")
    assert cell.error is not None and cell.error[0] == "JobInterrupted", cell.text
    assert "were starting: none of them ran" in cell.error[1], cell.error
    shown = ANSI.sub("", cell.traceback)
    assert "During handling of the above exception" not in shown and "ppkit/" not in shown, shown
    again = run_cell(kc, source)
    assert again.error is None and again.text.count("ran") == 3 or "[ranks 0-2] ran" in again.text, again.text


def test_kernel_interrupt_runs_a_torchrun_ranks_keyboardinterrupt_handler(kernel, tmp_path):
    """As torchrun passes Ctrl-C on (SIGINT to each worker): each rank's ``except KeyboardInterrupt:`` saves its
    checkpoint and exits. Interrupted once every rank is in its loop."""
    km, kc = kernel
    folder = str(tmp_path)

    def interrupt_when_looping():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all((tmp_path / f"looping_{r}").exists() for r in (0, 1)):
            time.sleep(0.1)
        time.sleep(0.5)
        km.interrupt_kernel()

    watcher = threading.Thread(target=interrupt_when_looping, daemon=True)
    watcher.start()
    cell = run_cell(kc, f"""%%torchrun --nproc-per-node 2 --timeout 120
import os, time, torch.distributed as dist
dist.init_process_group('gloo')
r = dist.get_rank()
open(os.path.join({folder!r}, f'looping_{{r}}'), 'w').close()
try:
    for step in range(1000):
        time.sleep(0.2)
except KeyboardInterrupt:
    open(os.path.join({folder!r}, f'ckpt_{{r}}.txt'), 'w').write(f'saved at {{step}}')
    print('saved', r, flush=True)
    raise SystemExit(0)
""")
    watcher.join(5)
    assert cell.error is not None and cell.error[0] == "JobInterrupted", cell.text
    assert sorted(p.name for p in tmp_path.glob("ckpt_*.txt")) == ["ckpt_0.txt", "ckpt_1.txt"], cell.text
    assert (tmp_path / "ckpt_1.txt").read_text().startswith("saved at "), cell.text


def test_glooss_own_explanation_reaches_the_learner_every_time(kc):
    """A size mismatch: gloo aborts the rank; what it printed first (its C++ exception) is in the cell, 8 runs of 8."""
    cell = run_cell(kc, "def case(i, n):\n    join(i, n)\n    dist.all_reduce(torch.ones(4 if i == 0 else 6))\n"
                        "for run in range(8):\n    print(f'=== run {run}', flush=True)\n    spawn(case, 2, 20)\n")
    assert cell.error is None, cell.text
    runs = cell.text.split("=== run ")[1:]
    assert len(runs) == 8, cell.text
    said = [run for run in runs if "Is there a distributed collective mismatch in your code?" in run]
    assert len(said) == 8, f"{len(said)} of 8 runs showed gloo's words:\n{cell.text}"


def test_a_ranks_error_is_shown_once_without_ppkits_frames(kc):
    cell = run_cell(kc, "%%torchrun --nproc-per-node 2\nimport os\n"
                        "if os.environ['RANK'] == '1':\n    raise ValueError('boom-in-rank-1')\n")
    assert cell.error is not None and cell.error[0] == "ProcessRaisedError", cell.text
    shown = cell.text + ANSI.sub("", cell.traceback)
    assert shown.count("--- traceback in rank 1 ---") == 1, shown
    assert shown.count("    raise ValueError('boom-in-rank-1')\n") == 1, shown  # the rank's traceback, once
    assert "ppkit/" not in ANSI.sub("", cell.traceback), shown


@pytest.mark.parametrize("raised", [
    "def load():\n    try:\n        int('x')\n    except ValueError as e:\n"
    "        raise RuntimeError('chained-boom') from e\nif r == 1:\n    load()\n",
    "if r == 1:\n    raise ExceptionGroup('group-boom', [ValueError('sub-a'), TypeError('sub-b')])\n"],
    ids=["chained_cause", "exception_group"])
def test_a_ranks_chained_or_grouped_error_keeps_its_cause_and_members_and_no_ppkit_frame(kc, raised):
    cell = run_cell(kc, "%%torchrun --nproc-per-node 2\nimport os\nr = int(os.environ['RANK'])\n" + raised)
    assert cell.error is not None and cell.error[0] == "ProcessRaisedError", cell.text
    shown = cell.text + ANSI.sub("", cell.traceback)
    assert "ppkit/" not in shown, shown
    if "chained" in raised:
        assert "ValueError: invalid literal for int() with base 10: 'x'" in shown, shown  # the cause
        assert "The above exception was the direct cause of the following exception:" in shown, shown
        assert "RuntimeError: chained-boom" in shown, shown
    else:
        assert "| ValueError: sub-a" in shown and "| TypeError: sub-b" in shown, shown  # the group's members


@pytest.mark.parametrize("order", ["alone", "with_work"])
def test_ranks_get_pythons_sigint_handler_whenever_load_ext_started_the_fork_server(tmp_path, order):
    """``alone``: %load_ext ppkit alone in its cell, the fork server starting after the cell ended, when
    ipykernel ignores SIGINT (the prestart is held back 3 s to make that order certain); ``with_work``: it
    starts while the cell still runs, when SIGINT has Python's handler."""
    first = ("import time\nfrom ppkit.cluster.spawn import call\nstart = call._prestart\n"
             "call._prestart = lambda *args: (time.sleep(3), start(*args))\n%load_ext ppkit" if order == "alone" else
             "%load_ext ppkit\nimport time\ntime.sleep(15)")
    with kernel_in(tmp_path, expect_processes=True) as (_, kc):
        assert run_cell(kc, first).error is None
        if order == "alone":
            time.sleep(15)  # idle: the prestart thread starts the fork server between cells
        waited = run_cell(kc, "import threading\nprint('prestarting', "
                              "any(t.name == 'ppkit-spawn-prestart' for t in threading.enumerate()))")
        assert "prestarting False" in waited.text, waited.text
        cell = run_cell(kc, "%%torchrun --nproc-per-node 2\nimport signal\n"
                            "print('sigint', signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
        assert cell.error is None, cell.text
        assert "[ranks 0-1] sigint True" in cell.text or cell.text.count("sigint True") == 2, cell.text


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_torchrun_runs_records_are_on_its_error_and_fr_trace_reads_them_as_the_doctor_does(kc, tmp_path, nproc):
    cell = run_cell(kc, f"""
src = '''import torch, torch.distributed as dist
dist.init_process_group('gloo')
t = torch.ones(4)
dist.all_reduce(t)
dist.all_reduce(t) if dist.get_rank() == 0 else dist.broadcast(t, src=0)
'''
try:
    get_ipython().run_cell_magic('torchrun', '--nproc-per-node {nproc} --timeout 9', src)
except ppkit.JobTimeoutError as exc:
    error = exc
print('records', sorted(error.flight_records))
print('doctor', error.diagnosis.mismatched[0].seq, error.diagnosis.mismatched[0].mismatch)
error.diagnosis.write_dumps({str(tmp_path)!r})
print('files', sorted(os.listdir({str(tmp_path)!r})))
asked = ppkit.collective_doctor()  # no %%ranks cluster: the last run's reading
print('on demand', sorted(asked.records), asked.mismatched[0].seq)
print(asked)
""")
    assert cell.error is None, cell.text
    assert f"records {list(range(nproc))}" in cell.text, cell.text
    assert "doctor 2 the op differs" in cell.text, cell.text
    assert f"on demand {list(range(nproc))} 2" in cell.text, cell.text
    assert "(the records of the last %%torchrun run, which failed; read as it ended, not now)" in cell.text
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)
    said = fr.stdout + fr.stderr
    assert fr.returncode == 0, said
    verdict = re.search(r"Collective sequence number: (\d+) has errors.*?Error type: (\w+)", said, re.DOTALL)
    assert verdict, said
    doctor = re.search(r"doctor (\d+) (.+)", cell.text)
    assert verdict[1] == doctor[1] and KINDS[verdict[2]] == doctor[2], (said, cell.text)  # the same seq, the same kind


def test_the_dump_files_name_the_learners_line_as_torchs_frames():
    from ppkit.cluster.hang_doctor.fr_dumps import dump

    call = {"group": "0", "desc": "default_pg", "seq": 1, "p2p_seq": 0, "is_p2p": False, "op": "all_reduce",
            "profiling_name": "gloo:all_reduce", "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"],
            "output_dtypes": ["Float"], "state": "completed", "done": True, "time_created_ns": 1,
            "at": {"file": "<%%torchrun cell 3>", "line": 4, "func": "<module>", "code": "dist.all_reduce(t)"}}
    entry = dump(0, {"calls": [call], "groups": {"0": {"desc": "default_pg", "ranks": [0, 1]}}}, 2)["entries"][0]
    assert entry["frames"] == [{"name": "<module>", "filename": "<%%torchrun cell 3>", "line": 4}], entry


def test_an_interrupted_torchrun_names_its_blocked_ranks_as_ranks():
    from ppkit.cluster.spawn import explain
    from ppkit.cluster.torchrun.launch import CELL_MAGIC
    from ppkit.errors import JobInterrupted

    text = str(explain.interrupted(JobInterrupted("", [1], {1: '  File "<%%torchrun cell 2>", line 3\n'}), CELL_MAGIC))
    assert "(rank(s) [1] were blocked outside Python" in text and "Where each rank was:" in text, text
    assert "process" not in text.replace("Every process of this call", ""), text


def test_which_rank_errors_are_failed_collectives():
    """gloo's error from autograd (DDP) is one; a store's error or the learner's own is not."""
    from ppkit.cluster.hang_doctor.outcomes import failed_in_a_collective
    from ppkit.transport.messages import ErrorInfo

    ddp = ErrorInfo("RuntimeError", "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by "
                    "peer [127.0.0.1]:16275.", '  File "train.py", line 9, in <module>\n'
                    '  File ".../torch/autograd/graph.py", line 829, in _engine_run_backward')
    assert failed_in_a_collective(ddp)
    assert failed_in_a_collective(ErrorInfo("DistBackendError", "NCCL error", 'File "train.py", line 3'))
    assert failed_in_a_collective(ErrorInfo("RuntimeError", "x", 'File ".../torch/distributed/distributed_c10d.py"'))
    waited = ErrorInfo("RuntimeError", "[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out", (
        '  File ".../torch/distributed/distributed_c10d.py", line 3913, in all_reduce\n'
        '  File ".../ppkit/transport/flight_calls.py", line 115, in wait'))  # the recorder's wrapper of Work.wait
    assert failed_in_a_collective(waited)
    # the learner's own errors with gloo's words, raised in the learner's code, are not (a download failing)
    own = 'Traceback (most recent call last):\n  File "/tmp/ipykernel_1/398.py", line 5, in case\n'
    assert not failed_in_a_collective(ErrorInfo("OSError", "downloading shard 3: Connection closed by peer", own))
    assert not failed_in_a_collective(ErrorInfo("RuntimeError", "fetch: gloo/transport/ said no", own))
    assert not failed_in_a_collective(ErrorInfo("DistStoreError", "Connection reset by peer", 'File "train.py"'))
    assert not failed_in_a_collective(ErrorInfo("ValueError", "no", 'File "train.py", line 3'))


def test_a_ranks_error_outside_ipython_renders_as_the_usual_traceback(monkeypatch):
    import IPython

    import ppkit

    # outside IPython: another test of this worker's process may have made an InteractiveShell
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)

    try:
        raise ppkit.JobTimeoutError("the ranks did not finish", [0], {})
    except ppkit.JobTimeoutError as exc:
        error = exc
    lines = error._render_traceback_()  # no IPython shell here: Python's own traceback
    assert lines[0].startswith("Traceback") and lines[-1] == "ppkit.errors.JobTimeoutError: the ranks did not finish\n"
    assert error.flight_records == {} and error.diagnosis is None
