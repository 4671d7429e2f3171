"""A torchrun script as a ``%%torchrun`` cell against ``torchrun`` of the same file, in one process.

    python benchmarks/bench_torchrun.py                 # 10 runs of each, 2 processes
    python benchmarks/bench_torchrun.py --runs 5 --nproc 4

The script is the smallest distributed one: ``init_process_group("gloo")``, one ``all_reduce``,
``destroy_process_group()``. Both are timed from the same Python process (one that imported torch
and ppkit, as a notebook kernel has), in alternating rounds so that the shared machine's load falls
on both alike:

- ``%%torchrun --nproc-per-node N``: the script as a cell, through IPython's InteractiveShell, as a
  notebook runs it; its first run starts the fork server, and is counted in the total;
- ``python -m torch.distributed.run --nproc-per-node N script.py``: torchrun as ``!torchrun`` in a
  cell runs it, a subprocess, each worker a fresh interpreter that imports torch.

Prints a markdown table. Target (issue 31): the cell at least 3x faster over the runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1) * dist.get_rank()
dist.all_reduce(total)
dist.destroy_process_group()
"""


def torchrun_command(nproc: int, path: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), str(path)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each (default 10)")
    parser.add_argument("--nproc", type=int, default=2, help="--nproc-per-node (default 2)")
    options = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from IPython.core.interactiveshell import InteractiveShell

    import ppkit
    from ppkit.cluster.spawn import call as spawn_call

    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext ppkit", store_history=False)
    cell = f"%%torchrun --nproc-per-node {options.nproc}\n{SCRIPT}"
    times: dict[str, list[float]] = {"cell": [], "torchrun": []}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "allreduce.py"
        path.write_text(SCRIPT)
        os.chdir(folder)
        for _ in range(options.runs):
            start = time.perf_counter()
            result = shell.run_cell(cell, store_history=False)
            times["cell"].append(time.perf_counter() - start)
            if not result.success:
                raise SystemExit(f"%%torchrun failed: {result.error_in_exec}")
            start = time.perf_counter()
            subprocess.run(torchrun_command(options.nproc, path), check=True, capture_output=True)
            times["torchrun"].append(time.perf_counter() - start)
        os.chdir(REPO)
    spawn_call.close()

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n{options.runs} runs of each, {options.nproc} processes, init + one all_reduce + destroy; "
          f"ppkit {ppkit.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {load:.1f} at the end\n")
    print("| how | total (s) | first run (s) | median run (s) |\n|---|---|---|---|")
    names = {"cell": f"`%%torchrun --nproc-per-node {options.nproc}` cell (the first run starts the fork server)",
             "torchrun": f"`torchrun --nproc-per-node {options.nproc} allreduce.py` (subprocess)"}
    for key, label in names.items():
        runs = times[key]
        print(f"| {label} | {sum(runs):.2f} | {runs[0]:.2f} | {statistics.median(runs):.3f} |")
    total = sum(times["torchrun"]) / sum(times["cell"])
    median = statistics.median(times["torchrun"]) / statistics.median(times["cell"])
    print(f"\n%%torchrun was {total:.1f}x faster over the {options.runs} runs, the first included "
          f"({median:.1f}x per run once the fork server runs); the target is 3x.")


if __name__ == "__main__":
    main()
