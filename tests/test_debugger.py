"""pdb on ranks (issue 32), driven as a learner drives it: a real Jupyter kernel runs the cells, and the
test answers pdb's prompts through the kernel's stdin (what JupyterLab's input box sends).

One kernel and one 2-rank cluster in it serve every scenario (they cost seconds to start); each test is a
cell or two in that session, and the module's end checks that no ppkit process outlives the kernel.
"""

from __future__ import annotations

import json
import queue
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kernels import kernel_in
from leftovers import wait_gone
from test_layout import payload_problems

import ppkit
from ppkit.transport.debug import messages as debug_messages

CELL_TIMEOUT_S = 120.0

START = """
import time
import ppkit
import torch
import torch.distributed as dist
cluster = ppkit.start(2, "gloo", timeout=30)

def stop_on_rank_1(rank, world_size):
    x = rank * 10 + 7
    if rank == 1:
        breakpoint()
    y = x + 1
    return y
"""


class Cell:
    """What one executed cell showed: its stdout/stderr text, the prompts it asked, its error."""

    def __init__(self):
        self.text = ""
        self.prompts: list[str] = []
        self.error: tuple[str, str] | None = None
        self.traceback = ""  # IPython's traceback of the error, as the cell shows it (ANSI colours left in)


def run_cell(kc, code: str, answers=(), allow_stdin: bool = True, on_prompt=None) -> Cell:
    """Execute ``code``; answer each input prompt with the next of ``answers`` (a string, or a pair
    (seconds to wait first, string)); ``on_prompt(kc)`` instead of answering, if given."""
    answers = list(answers)
    cell, unexpected = Cell(), []
    msg_id = kc.execute(textwrap.dedent(code), allow_stdin=allow_stdin)
    deadline = time.monotonic() + CELL_TIMEOUT_S
    replied = idle = False
    while not (replied and idle):
        assert time.monotonic() < deadline, f"the cell did not finish; it showed:\n{cell.text}"
        if allow_stdin:
            try:
                msg = kc.get_stdin_msg(timeout=0.02)
                cell.prompts.append(msg["content"]["prompt"])
                if on_prompt is not None:
                    on_prompt(kc)
                elif not answers:  # quit, so that the kernel is free for the next test
                    unexpected.append(msg["content"]["prompt"])
                    kc.input("q")
                else:
                    answer = answers.pop(0)
                    if isinstance(answer, tuple):
                        time.sleep(answer[0])
                        answer = answer[1]
                    kc.input(answer)
            except queue.Empty:
                pass
        try:
            msg = kc.get_iopub_msg(timeout=0.02)
            if msg["parent_header"].get("msg_id") == msg_id:
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    cell.text += content["text"]
                elif kind == "error":
                    cell.error = (content["ename"], content["evalue"])
                    cell.traceback = "\n".join(content.get("traceback", []))
                elif kind == "execute_result":
                    cell.text += content["data"].get("text/plain", "") + "\n"
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
        except queue.Empty:
            pass
        try:
            msg = kc.get_shell_msg(timeout=0.02)
            replied = replied or msg["parent_header"].get("msg_id") == msg_id
        except queue.Empty:
            pass
    assert not answers, f"prompts never came for {answers} ({cell.error}); the cell showed:\n{cell.text}"
    assert not unexpected, f"unexpected prompts {unexpected}; the cell showed:\n{cell.text}"
    return cell


@pytest.fixture(scope="module")
def kernel():
    with kernel_in(expect_processes=True) as (km, kc):
        cell = run_cell(kc, START)
        assert cell.error is None, cell
        yield km, kc


@pytest.fixture
def kc(kernel):
    """The session's kernel client; the cluster in it is ready when the test starts and ends."""
    km, client = kernel
    yield client
    state = run_cell(client, "print(cluster.state)")
    assert state.text.strip() == "ready", state.text


def test_the_debug_messages_are_typed_frozen_dataclasses():
    classes = [c for c in vars(debug_messages).values()
               if isinstance(c, type) and c.__module__ == debug_messages.__name__]
    assert len(classes) == 4
    assert [p for c in classes for p in payload_problems(c, debug_messages)] == []


def test_a_session_steps_prints_and_lists_the_cells_source(kc):
    cell = run_cell(kc, "print(cluster.run(stop_on_rank_1))", ["p x", "n", "p y", "l", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) "] * 5
    assert "rank 1 stopped at" in cell.text and "Rank(s) [0] run on until they wait for it" in cell.text
    assert re.search(r"-> y = x \+ 1\n17\n> .*stop_on_rank_1\(\)\n-> return y\n18\n", cell.text), cell.text
    listing = cell.text.split("\n18\n", 1)[1]
    assert "def stop_on_rank_1(rank, world_size):" in listing and "->\t    return y" in listing  # the cell's lines
    assert cell.text.rstrip().endswith("[8, 18]")


def test_ll_w_and_a_breakpoint_set_at_the_prompt(kc):
    cell = run_cell(kc, "print(cluster.run(stop_on_rank_1))", ["ll", "w", "b 12", "c", "p y", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) "] * 6
    assert "  7  \tdef stop_on_rank_1(rank, world_size):" in cell.text, cell.text  # ll: the function, from the cell
    assert "in _run_job" not in cell.text  # w: the job's frames; the worker's own are hidden
    assert re.search(r"Breakpoint 1 at .*:12\n", cell.text) and "\n18\n" in cell.text, cell.text
    assert cell.text.rstrip().endswith("[8, 18]")


@pytest.mark.parametrize("how", ["rank == 1 and pdb.set_trace()", "dist.breakpoint(rank=1)"])
def test_pdb_set_trace_and_torch_distributed_breakpoint_open_a_session(kc, how):
    code = f"""
    def other_way(rank, world_size):
        import pdb
        value = rank + 100
        {how}
        return value
    print(cluster.run(other_way))
    """
    answers = ["u", "p value", "c"] if "dist." in how else ["p value", "c"]
    cell = run_cell(kc, code, answers)
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) "] * len(answers)
    assert "\n101\n" in cell.text
    assert cell.text.rstrip().endswith("[100, 101]")


def test_a_half_line_the_stopped_rank_printed_comes_before_its_prompt(kc):
    code = """
    def half_line_then_stop(rank, world_size):
        if rank == 1:
            print("x =", 7, end="", flush=True)
            breakpoint()
        return rank
    print(cluster.run(half_line_then_stop))
    """
    cell = run_cell(kc, code, ["c"])
    assert cell.error is None, cell.text
    assert "[rank 1] x = 7\n" in cell.text, cell.text
    assert cell.text.index("[rank 1] x = 7") < cell.text.index("rank 1 stopped at"), cell.text


def test_two_ranks_stopped_take_turns_and_each_prompt_says_who_waits(kc):
    code = """
    def both_stop(rank, world_size):
        if rank == 0:
            time.sleep(0.5)  # rank 1 stops first; rank 0 stops while the learner thinks
        mine = f"rank {rank}'s"
        breakpoint()
        t = torch.ones(1) * (rank + 1)
        dist.all_reduce(t)
        return int(t)
    print(cluster.run(both_stop))
    """
    cell = run_cell(kc, code, [(1.5, "p mine"), "c", "p mine", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 1) [also at a breakpoint: rank(s) [0]] ",
                            "(Pdb rank 0) ", "(Pdb rank 0) "]
    assert cell.text.index("rank 1's") < cell.text.index("rank 0's")
    assert cell.text.rstrip().endswith("[3, 3]")


def test_a_rank_at_a_prompt_is_not_a_timeout_and_the_timeout_resumes_after_c(kc):
    code = """
    def think_then_hang(rank, world_size, hang):
        if rank == 1:
            breakpoint()
            if hang:
                time.sleep(60)
        return rank
    print(cluster.run(think_then_hang, False, timeout=2))
    """
    cell = run_cell(kc, code, [(4.0, "c")])  # the learner thinks twice the job's timeout
    assert cell.error is None, cell.text
    assert cell.text.rstrip().endswith("[0, 1]")
    started = time.monotonic()
    cell = run_cell(kc, code.replace("False, timeout=2", "True, timeout=2"), [(3.0, "c")])
    assert cell.error is not None and cell.error[0] == "JobTimeoutError", cell.text
    assert time.monotonic() - started < 3.0 + 2.0 + 15.0  # the 2 s timeout resumed after c
    assert run_cell(kc, "cluster.restart()").error is None  # the rank still sleeps: a timeout breaks the cluster


def test_quit_stops_every_rank_restarts_the_blocked_ones_and_the_next_run_works(kc):
    code = """
    def quit_me(rank, world_size):
        t = torch.ones(1)
        if rank == 1:
            breakpoint()
        dist.all_reduce(t)  # rank 0 waits here for rank 1
        return int(t)
    old = [w["pid"] for w in cluster.workers.values()]
    cluster.run(quit_me)
    """
    cell = run_cell(kc, code, ["q"])
    assert cell.error is not None and cell.error[0] == "DebuggerQuit", cell.text
    assert "you quit pdb on rank 1" in cell.error[1] and "ppkit restarted every rank" in cell.error[1]
    again = run_cell(kc, """
    import psutil
    print(cluster.run(lambda rank, world_size: (dist.all_reduce(t := torch.ones(1)), int(t))[1]))
    print("old gone:", not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in old))
    """)
    assert again.error is None, again.text
    assert "[2, 2]" in again.text and "old gone: True" in again.text


def test_kernel_interrupt_at_a_prompt_stops_the_job_on_every_rank(kernel, kc):
    km, _ = kernel
    code = """
    def interrupt_me(rank, world_size):
        t = torch.ones(1)
        if rank == 0:
            breakpoint()
        dist.all_reduce(t)
        return int(t)
    cluster.run(interrupt_me)
    """
    cell = run_cell(kc, code, on_prompt=lambda _: km.interrupt_kernel())
    assert cell.prompts == ["(Pdb rank 0) "]
    assert cell.error is not None and cell.error[0] == "JobInterrupted", cell.text
    assert "interrupted during the pdb session on rank 0" in cell.error[1]


def test_without_stdin_a_breakpoint_is_a_clear_error_within_seconds(kc):
    started = time.monotonic()
    cell = run_cell(kc, "cluster.run(stop_on_rank_1)", allow_stdin=False)
    assert time.monotonic() - started < 5.0
    assert cell.error is not None and cell.error[0] == "DebuggerQuit", cell.text
    assert "rank 1 stopped at a breakpoint" in cell.error[1] and "line 11, in stop_on_rank_1" in cell.error[1]
    assert "PYTHONBREAKPOINT=0" in cell.error[1]


def test_debug_after_a_ranks_error_opens_pdb_at_the_raising_frame(kc):
    code = """
    def wrong_shape(rank, world_size):
        x = torch.ones(3, 2 + 2 * rank)  # (3, 2) @ (3, 2) on rank 0, (3, 4) @ (3, 4) on rank 1
        return (x @ x).sum()
    cluster.run(wrong_shape)
    """
    cell = run_cell(kc, code)
    assert cell.error is not None and cell.error[0] == "RemoteError"
    cell = run_cell(kc, "%debug", ["p x.shape", "p rank", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 0) "] * 3
    assert "post-mortem on rank 0: RuntimeError" in cell.text and "-> return (x @ x).sum()" in cell.text
    assert "torch.Size([3, 2])\n0\n" in cell.text
    cell = run_cell(kc, "cluster.debug(1)", ["p x.shape", "q"])  # the other rank kept its own error
    assert cell.error is None and "torch.Size([3, 4])" in cell.text, cell.text
    run_cell(kc, "cluster.run(lambda rank, world_size: rank)")
    cell = run_cell(kc, "cluster.debug(1)")  # a new job: the traceback is gone, and the message says so
    assert cell.error is not None and cell.error[0] == "ClusterStateError" and "keeps no error" in cell.error[1]


def test_twenty_sessions_in_a_row_leave_nothing_behind(kc):
    before = run_cell(kc, "print(sorted(w['pid'] for w in cluster.workers.values()))").text
    cell = run_cell(kc, "for _ in range(20): cluster.run(stop_on_rank_1)", ["p x", "c"] * 20)
    assert cell.error is None, cell.text
    assert cell.text.count("\n17\n") == 20
    assert run_cell(kc, "print(sorted(w['pid'] for w in cluster.workers.values()))").text == before


def test_debug_says_what_it_needs_and_leaves_other_errors_to_ipython(kc):
    assert "ranks 0..1, not 5" in run_cell(kc, "cluster.debug(5)").error[1]
    assert run_cell(kc, "1 / 0").error[0] == "ZeroDivisionError"
    cell = run_cell(kc, "cluster.debug()")
    assert cell.error[0] == "ConfigError" and "cluster.debug(rank=1)" in cell.error[1]
    cell = run_cell(kc, "%debug", ["p 1 + 1", "q"])  # the kernel's own error: IPython's own post-mortem
    assert cell.prompts == ["ipdb> "] * 2 and "2" in cell.text, cell.text
    assert run_cell(kc, "cluster.run(lambda rank, world_size: 1 / (rank - 1))").error[0] == "RemoteError"
    cell = run_cell(kc, "cluster.debug(1)", allow_stdin=False)
    assert cell.error[0] == "DebuggerQuit" and "does not allow input" in cell.error[1], cell
    cell = run_cell(kc, "cluster.debug(1)", ["p rank", "c"])  # pdb left the rank: it can be asked again
    assert cell.error is None and "ZeroDivisionError" in cell.text and "\n1\n" in cell.text, cell.text


def test_breakpoints_in_ppkit_spawn_torchrun_and_ranks_cells_and_their_post_mortem_advice(kc):
    code = """
    def spawned(i, offset):
        value = i + offset
        if i == 1:
            breakpoint()
        print("value", value)
    ppkit.spawn(spawned, args=(40,), nprocs=2)
    """
    cell = run_cell(kc, code, ["p value", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) "] * 2 and "\n41\n" in cell.text
    cell = run_cell(kc, code, ["q"])
    assert cell.error is not None and "you quit pdb on rank 1" in cell.error[1], cell
    torchrun = """
    def main():
        import os
        rank = int(os.environ["RANK"])
        if rank == 1:
            breakpoint()
        print("rank", rank, "done")
    ppkit.torchrun(main, nproc_per_node=2)
    """
    cell = run_cell(kc, torchrun, ["p rank", "c"])
    assert cell.error is None and cell.prompts == ["(Pdb rank 1) "] * 2 and "\n1\n" in cell.text, cell.text
    assert run_cell(kc, "ppkit.spawn(lambda i: 1 / i, nprocs=2)").error[0] == "ProcessRaisedError"
    cell = run_cell(kc, "%debug", ["p i", "q"])  # the process that raised stays for it
    assert cell.error is None and "post-mortem on rank 0: ZeroDivisionError" in cell.text, cell.text
    ranks_cell = "%%ranks\nlabel = f'on {rank}'\nif rank == 0:\n    breakpoint()\nprint(label)"
    cell = run_cell(kc, ranks_cell, ["p label", "c"])
    assert cell.error is None and cell.prompts == ["(Pdb rank 0) "] * 2 and "'on 0'" in cell.text, cell.text


def test_pythonbreakpoint_0_skips_breakpoints_on_the_ranks(kc):
    cell = run_cell(kc, """
    with ppkit.Cluster(2, process_group=False, env={"PYTHONBREAKPOINT": "0"}) as quiet:
        print(quiet.run(stop_on_rank_1))
    """)
    assert cell.error is None and cell.prompts == [] and "[8, 18]" in cell.text, cell.text


def test_notebook_00s_pdb_cell_runs_as_its_text_says(kc):
    """The cell nbval skips (it needs answers) works as the markdown above it tells the learner to use it."""
    cells = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "00_start_here.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    source = next(s for s in sources if "breakpoint()" in s)
    assert source.startswith("# NBVAL_SKIP\n")
    cell = run_cell(kc, source, ["p x", "n", "p x", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) "] * 4
    assert "\ntensor([1.])\n" in cell.text and "\ntensor([10.])\n" in cell.text
    assert cell.text.rstrip().endswith("[10.0, 10.0]")  # all_reduce of 0 and 10 on both ranks


def test_stepping_over_a_collective_that_needs_a_rank_at_its_own_prompt_moves_on_to_that_rank(kc):
    code = """
    def both_stop_then_reduce(rank, world_size):
        if rank == 0:
            time.sleep(0.5)
        t = torch.ones(1) * (rank + 1)
        breakpoint()
        dist.all_reduce(t)
        return int(t)
    print(cluster.run(both_stop_then_reduce))
    """
    # rank 1 first; its `n` blocks in all_reduce until rank 0, stopped at its own prompt, goes on
    cell = run_cell(kc, code, [(1.0, "n"), "c", "p t", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) ", "(Pdb rank 0) ", "(Pdb rank 1) ", "(Pdb rank 1) "], cell.text
    assert "rank 1 is busy (probably in a collective" in cell.text and "over to rank 0" in cell.text
    assert "-> return int(t)\ntensor([3.])\n" in cell.text and cell.text.rstrip().endswith("[3, 3]")


def test_interact_opens_a_console_in_the_ranks_frame(kc):
    cell = run_cell(kc, "print(cluster.run(stop_on_rank_1))", ["interact", "z = x * 2", "z", "exit()", "p z", "c"])
    assert cell.error is None, cell.text
    assert cell.prompts == ["(Pdb rank 1) ", ">>> ", ">>> ", ">>> ", "(Pdb rank 1) ", "(Pdb rank 1) "], cell.text
    assert "*interactive*" in cell.text and "34" in cell.text and "NameError" in cell.text  # z lived in the console


TRACED_CALL_AFTER_A_DROP = """
import sys, threading
from ppkit.transport.debug.rank_pdb import drop_async_exc
def helper():
    return 1
drop_async_exc(threading.get_ident())  # what a worker does at the end of every job
sys.settrace(lambda frame, event, arg: None)  # pdb's `n` traces every call like this
print(helper() + helper())
"""


def test_a_traced_call_after_a_dropped_cancel_returns():
    # CPython 3.11: after PyThreadState_SetAsyncExc(id, NULL) a traced call re-ran its first instruction for ever
    done = subprocess.run([sys.executable, "-c", TRACED_CALL_AFTER_A_DROP], capture_output=True, text=True,
                          timeout=30)
    assert done.stdout == "2\n", done.stderr


def test_a_rank_that_raises_while_another_is_at_a_prompt_waits_for_the_session(kc):
    code = """
    def one_raises(rank, world_size):
        if rank == 0:
            raise ValueError("rank 0 is wrong")
        x = 5
        breakpoint()
        return x
    cluster.run(one_raises)
    """
    cell = run_cell(kc, code, [(4.0, "p x"), "c"])  # longer than the 3 s other ranks get after an error
    assert cell.prompts == ["(Pdb rank 1) "] * 2 and "\n5\n" in cell.text, cell.text
    assert cell.error[0] == "RemoteError" and cell.error[1].startswith("rank 0 raised ValueError: rank 0 is wrong")
    assert "still blocked" not in cell.error[1]  # rank 1 finished after c: the cluster stays ready


NOTEBOOK_02 = Path(__file__).resolve().parents[1] / "notebooks" / "02_collectives.ipynb"


def pdb_transcript(markdown: str) -> list[tuple[str | None, list[tuple[str, str]], list[str]]]:
    """The pdb sessions a notebook's markdown shows in its code block, one per blank-line-separated part:
    (the line that opens it, or None for the cell below the markdown; each prompt, ``(Pdb rank r) ``, with
    the command typed after it; the fragments every other line says the cell shows, split at its "..." and
    with its ``<- comment`` left out)."""
    block = markdown.split("```")[1].strip("\n")
    sessions = []
    for part in block.split("\n\n"):
        opening, commands, shown = None, [], []
        for line in part.splitlines():
            if line.startswith("(Pdb rank "):
                prompt, command = line.split(") ", 1)
                commands.append((prompt + ") ", command))
            elif line.startswith(("%", "cluster.")):
                opening = line
            else:
                shown += [f.strip() for f in line.split("<-")[0].split("...") if f.strip()]
        sessions.append((opening, commands, shown))
    return sessions


def test_notebook_02s_pdb_sessions_show_what_its_markdown_says(kc):
    # the cells an automatic run skips (NBVAL_SKIP: they wait for a learner's answers), run here with the
    # answers their markdown shows, on the notebook's own cluster (4 ranks, DETAIL); then this module's again
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK_02.read_text())["cells"]]
    cells = cells[next(i for i, s in enumerate(cells) if s.startswith("## 5. Finding a collective bug")):]

    def cell(start: str) -> str:
        found = [s for s in cells if s.startswith(start) or s.startswith("# NBVAL_CHECK_OUTPUT\n" + start)]
        assert len(found) == 1, (start, found)
        return found[0]

    def shows(text: str, fragments: list[str]) -> None:
        missing = [f for f in fragments if f not in text]
        assert not missing, f"the notebook's markdown says the cell shows {missing}; it showed:\n{text}"

    start = re.search(r"^cluster = ppkit\.start\(.*\)$", cell("import re"), flags=re.MULTILINE).group(0)
    try:
        setup = run_cell(kc, "\n".join([start, cell("def batch_losses"), cell("def mean_loss_v2")]))
        assert setup.error is None and "the mean loss is nan" in setup.text, setup.text
        markdown = next(s for s in cells if "### Then stepped through" in s)
        [(_, commands, shown)] = pdb_transcript(markdown.split("### Then stepped through")[1])
        stepped = run_cell(kc, cell("# NBVAL_SKIP\n# (this cell waits"), [c for _, c in commands])
        assert stepped.prompts == [p for p, _ in commands]
        shows(stepped.text + f"{stepped.error[0]}: {stepped.error[1]}", shown)
        rerun = run_cell(kc, cell("# NBVAL_SKIP\n# (the same RemoteError"))
        assert rerun.error[0] == "RemoteError", rerun.text
        post_mortem = next(s for s in cells if "### A wrong result, found post mortem" not in s and "%debug\n(Pdb" in s)
        for opening, commands, shown in pdb_transcript(post_mortem):
            session = run_cell(kc, opening, [c for _, c in commands])
            assert session.error is None and session.prompts == [p for p, _ in commands], (session.error, session.text)
            shows(session.text, shown)
    finally:
        run_cell(kc, START.split("\n\n")[0])  # this module's 2-rank cluster again


def test_a_breakpoint_where_nothing_reads_its_prompt_is_a_clear_error_not_a_hang(kc):
    # a function that RPC runs on a worker: the kernel waits in rpc_sync, not in a job (the module's last test:
    # this kernel becomes an RPC master)
    cell = run_cell(kc, """
    import torch.distributed.rpc as rpc
    world = ppkit.start_rpc(1)
    def stop_remotely(x):
        breakpoint()
        return x
    try:
        rpc.rpc_sync("worker1", stop_remotely, args=(1,))
    finally:
        world.close()
    """)
    assert cell.error is not None and cell.prompts == [], cell.text
    assert "outside a cluster.run job (in a function run by RPC" in cell.error[1], cell.error


def _shapes_differ(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(3 if rank == 0 else 4)  # the learner's mistake: rank 1 sends a longer tensor
    dist.all_reduce(t)
    return t.tolist()


def test_torch_distributed_debug_detail_from_env_turns_a_shape_mismatch_into_an_error():
    # the ranks are forked from a fork server that imported torch before env= reached them. (Not no_leftovers:
    # the module's kernel keeps its own ppkit processes meanwhile; this cluster's are checked instead.)
    with ppkit.Cluster(2, "gloo", timeout=30, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}) as cluster:
        pids = [p.pid for p in cluster.processes()]
        with pytest.raises(ppkit.RemoteError) as raised:
            cluster.run(_shapes_differ)
    assert wait_gone(pids, 10.0) == []
    assert "Detected mismatch between collectives on ranks" in str(raised.value)
    assert "Tensor shapes: 3vs 4" in str(raised.value)
