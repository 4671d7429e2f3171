"""Run seed 002's SLURM program many times and count the tasks that abort at exit (issue 30, item 2).

    python benchmarks/seed002_exit_loop.py                    # 200 runs of srun -N2 -n4 python -m ppkit.lessons.seed002
    python benchmarks/seed002_exit_loop.py --runs 40 --cores /tmp/seed002-cores   # keep cores + gdb stacks

Starts its own two-node SLURM testbed (tests/slurm_testbed.py; SLURM installed with `make slurm`), runs
``srun --nodes=2 --ntasks=4 python -m ppkit.lessons.seed002`` ``--runs`` times, and stops the testbed.
A run counts as *aborted* when srun reports a task Aborted / exit 134 or a task printed "terminate called";
as *failed* when it went wrong otherwise (no four JSON lines, other exit status). Prints one line per bad
run and a summary; exits 1 if any run aborted or failed.

With ``--cores DIR`` every run gets DIR/run-N as the tasks' working directory and core dumps allowed
(kernel.core_pattern must be a plain ``core...`` for the core to land there); a bad run keeps its
directory with srun's output and, per core, ``gdb -batch -ex "thread apply all bt"`` (gdb.txt).

What it found (torch 2.14.1, gloo): ``import torch._dynamo`` -- which DDP's constructor does -- imports
``torch.distributed.nn.functional``, whose functions take ``group=group.WORLD`` as a default argument.
Imported after ``init_process_group`` that default *is* the live default process group, so
``destroy_process_group()`` no longer frees it: its gloo threads, and on rank 0 the TCPStore server
thread, run on into interpreter shutdown; a gloo worker thread still dropping the last all_gather's
tensors then needs the GIL while Python finalizes, Python ends that thread with pthread_exit inside a
C++ destructor, and libstdc++ calls std::terminate ("terminate called without an active exception").
The aborting thread's stack (gdb on the core; the main thread is in Py_FinalizeEx -> PyGC_Collect):

    std::terminate() <- __gxx_personality_v0 <- _Unwind_ForcedUnwind <- __pthread_exit
    <- PyThread_exit_thread <- take_gil <- pybind11::gil_scoped_acquire <- ConcretePyInterpreterVTable::decref
    <- c10::TensorImpl::decref_pyobject <- c10d::AsyncAllgatherWork::~AsyncAllgatherWork
    <- c10d::AsyncBarrierWork::~AsyncBarrierWork <- c10d::ProcessGroupGloo::runLoop

The fix (ppkit/lessons/seed002.py): import torch.distributed.nn before init_process_group, so those defaults
are None and destroy_process_group() frees the group, joining its threads before Python finalizes.
``--pin-demo`` shows the cause in torch alone, one process, no SLURM (the program is PIN_DEMO below):
with the import after init_process_group, gloo's threads are still there after destroy_process_group().
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from ppkit.lessons.data_parallel import free_port  # noqa: E402

PIN_DEMO = """
import os, sys, tempfile
import torch.distributed as dist
if sys.argv[1] == "before":
    import torch.distributed.nn  # the workaround: group.WORLD is still None here
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
import torch.distributed.nn  # what `import torch._dynamo` (so DDP(...)) does
dist.destroy_process_group()
print(sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")))
"""
ABORT_MARKS = ("Aborted", "terminate called", "exit code 134", "signal 6")


def classify(proc: subprocess.CompletedProcess) -> str:
    """'ok', 'aborted' or 'failed' for one srun run."""
    text = proc.stdout + proc.stderr
    if any(mark in text for mark in ABORT_MARKS) or proc.returncode in (134, -6):
        return "aborted"
    records = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return "ok" if proc.returncode == 0 and len(records) == 4 else "failed"


def backtraces(directory: Path) -> list[Path]:
    """gdb's stacks of every thread, for each core file in ``directory``; the cores found."""
    cores = sorted(p for p in directory.glob("core*") if p.is_file() and p.suffix != ".txt")
    for core in cores:
        if shutil.which("gdb"):
            with open(directory / "gdb.txt", "a") as out:
                out.write(f"===== {core.name}\n")
                out.flush()
                subprocess.run(["gdb", "-batch", "-ex", "thread apply all bt 40", sys.executable, str(core)],
                               stdout=out, stderr=subprocess.STDOUT, timeout=300)
    return cores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ntasks", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=180, help="seconds one srun may take")
    parser.add_argument("--cores", type=Path, help="keep bad runs, their cores and gdb stacks here")
    parser.add_argument("--pin-demo", action="store_true", help="show the cause in torch alone, and stop")
    args = parser.parse_args(argv)
    if args.pin_demo:
        for when in ("after", "before"):
            out = subprocess.run([sys.executable, "-c", PIN_DEMO, when], capture_output=True, text=True, timeout=120)
            print(f"torch.distributed.nn imported {when} init_process_group -> threads after "
                  f"destroy_process_group(): {(out.stdout + out.stderr).strip()}")
        return 0

    from slurm_testbed import SlurmTestbed

    # stopped with Ctrl-C or `kill PID` (even started in the background): the testbed still stops
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cores:
        args.cores.mkdir(parents=True, exist_ok=True)
        soft, hard = resource.getrlimit(resource.RLIMIT_CORE)  # inherited by the daemons, so by the tasks
        resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
        pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
        if not pattern.startswith("core"):
            print(f"note: core_pattern is {pattern!r}: cores go there, not to the run's directory")
    counts = {"ok": 0, "aborted": 0, "failed": 0}
    started = time.monotonic()
    with SlurmTestbed() as tb:
        print(f"testbed up ({tb.conf_path}); {args.runs} runs of srun -N{args.nodes} -n{args.ntasks} "
              "python -m ppkit.lessons.seed002", flush=True)
        for i in range(1, args.runs + 1):
            cwd = args.cores / f"run-{i}" if args.cores else REPO
            cwd.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **tb.env, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
            env.pop("MASTER_ADDR", None)
            command = ["srun", f"--nodes={args.nodes}", f"--ntasks={args.ntasks}", sys.executable,
                       "-m", "ppkit.lessons.seed002"]
            try:
                proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                                      timeout=args.timeout)
                verdict = classify(proc)
            except subprocess.TimeoutExpired as exc:
                proc = subprocess.CompletedProcess(command, -1, str(exc.stdout or ""), f"timed out: {exc}")
                verdict = "failed"
                tb.run(["scancel", "--user", tb.env.get("USER", os.environ.get("USER", "root"))])
            counts[verdict] += 1
            if verdict != "ok":
                tail = " | ".join((proc.stderr.strip().splitlines() or ["(no stderr)"])[-3:])
                print(f"run {i}: {verdict.upper()} (srun exit {proc.returncode}): {tail}", flush=True)
            if args.cores:
                if verdict == "ok":
                    shutil.rmtree(cwd, ignore_errors=True)
                else:
                    (cwd / "out.txt").write_text(proc.stdout + "\n----- stderr\n" + proc.stderr)
                    cores = backtraces(cwd)
                    print(f"run {i}: {len(cores)} core(s) in {cwd}", flush=True)
            if i % 10 == 0:
                print(f"... {i} runs, {counts['aborted']} aborted, {counts['failed']} failed, "
                      f"{time.monotonic() - started:.0f} s", flush=True)
    runs = sum(counts.values())
    print(f"{runs} runs: {counts['aborted']} aborted, {counts['failed']} failed otherwise, {counts['ok']} ok "
          f"({time.monotonic() - started:.0f} s)")
    return 0 if counts["ok"] == runs else 1


if __name__ == "__main__":
    sys.exit(main())
