"""``%%torchrun`` in a real Jupyter kernel, for a fixed part of the corpus: the cell a learner writes, run by
the magic, and the doctor's answers that reached the cell, graded in the kernel (where they are computed).

    grades = in_a_kernel(["rank_skips_second_allreduce", ...])   # name -> Grade
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# the programs graded under %%torchrun: one of each kind the doctor names, and correct ones
KERNEL_PROGRAMS = ("allreduce_loop_correct", "allreduce_sizes_differ", "allreduce_against_broadcast",
                   "rank_skips_second_allreduce", "slow_rank_then_allreduce", "both_recv_first",
                   "isend_compute_recv", "groups_in_opposite_order", "ddp_rank_one_step_fewer", "ddp_correct")
CELL = """import torch.distributed as dist
from {module} import {name}
dist.init_process_group("gloo")
{name}(dist.get_rank(), dist.get_world_size())
dist.destroy_process_group()
"""
MARK = "CORPUS-GRADE "
ROOT = Path(__file__).resolve().parents[2]


def grade_here(name: str) -> None:
    """In the kernel: run ``name`` as a %%torchrun cell and print its grade as one JSON line."""
    from IPython import get_ipython

    from tests.bug_corpus import PROGRAMS, run
    from tests.bug_corpus.grade import grade_doctor

    program = next(p for p in PROGRAMS if p.name == name)
    cell = CELL.format(module=program.fn.__module__, name=name)
    error = None
    with run.watching() as produced:
        try:
            get_ipython().run_cell_magic("torchrun", f"--nproc-per-node {program.world_size} "
                                         f"--timeout {program.timeout:g}", cell)
        except BaseException as exc:  # noqa: BLE001 (the run's error is what the cell shows)
            error = exc
    outcome = run.Outcome("%%torchrun", error, run._shown(produced, error))
    grade = grade_doctor(program, outcome, "%%torchrun")
    print(MARK + json.dumps([grade.cls, grade.why]), flush=True)


def in_a_kernel(names=KERNEL_PROGRAMS, timeout: float = 120.0) -> dict:
    """Start one kernel (this repository on its path, the hang watch at PPKIT_HANG_S=2), grade each program in
    it, shut it down."""
    from jupyter_client.manager import start_new_kernel

    from tests.bug_corpus.grade import Grade

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "PPKIT_HANG_S": os.environ.get("PPKIT_HANG_S", "2")}
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT), env=env)
    grades = {}
    try:
        _execute(kc, "%load_ext ppkit\nimport tests.bug_corpus.kernel as corpus_kernel", timeout)
        for name in names:
            text = _execute(kc, f"corpus_kernel.grade_here({name!r})", timeout)
            line = next((ln for ln in text.splitlines() if ln.startswith(MARK)), None)
            if line is None:
                grades[name] = Grade("silent", "the kernel printed no grade: " + text[-300:])
            else:
                cls, why = json.loads(line[len(MARK):])
                grades[name] = Grade(cls, why)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return grades


def _execute(kc, code: str, timeout: float) -> str:
    out: list[str] = []

    def hook(msg):
        content = msg.get("content", {})
        if msg.get("msg_type") == "stream":
            out.append(content.get("text", ""))
        elif msg.get("msg_type") == "error":
            out.append("\n".join(content.get("traceback", [])))

    kc.execute_interactive(code, output_hook=hook, timeout=timeout)
    return "".join(out)
