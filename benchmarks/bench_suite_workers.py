"""The test suite in one pytest against two pytest-xdist workers (`make test`'s -n 2, tests/scheduling.py).

    python benchmarks/bench_suite_workers.py                  # make test-fast's tests, -n 0 then -n 2
    python benchmarks/bench_suite_workers.py --rounds 2 -- tests/test_spawn.py tests/test_cluster_run.py

Runs the same selection (by default what `make test-fast` runs) with each worker count in turn, ``--rounds`` times,
so that a machine that gets busier or quieter affects both. For each run it prints pytest's wall time, the passed and
failed counts, and how busy the machine's cores were (/proc/stat over the run); then the ratio of the medians.
Where the suite waits more than it computes, two workers finish sooner than one.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAST = ["tests", "notebooks/00_start_here.ipynb", "--nbval-lax", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg",
        "--ignore=tests/browser", "-m", "not slow and not slurm"]


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def run(workers: int, selection: list[str]) -> dict:
    busy0, total0 = cpu_times()
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
                           *selection], cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - start
    busy1, total1 = cpu_times()
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|errors?)", last)}
    return {"workers": workers, "wall": wall, "busy": (busy1 - busy0) / max(1, total1 - total0), "counts": counts,
            "summary": last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs per worker count (default 1)")
    parser.add_argument("selection", nargs="*", help="pytest arguments after --; default: make test-fast's tests")
    args = parser.parse_args()
    selection = args.selection or FAST
    if not Path("/proc/stat").exists():
        raise SystemExit("this benchmark reads /proc/stat for how busy the cores were: Linux only")
    print(f"{os.cpu_count()} cores; selection: {' '.join(selection)}")
    walls: dict[int, list[float]] = {0: [], 2: []}
    for _ in range(args.rounds):
        for workers in (0, 2):
            r = run(workers, selection)
            walls[workers].append(r["wall"])
            print(f"-n {workers}: {r['wall']:7.1f} s, cores {r['busy']:.0%} busy; {r['summary']}", flush=True)
    one, two = statistics.median(walls[0]), statistics.median(walls[2])
    print(f"median wall time: one pytest {one:.1f} s, two workers {two:.1f} s; one / two = {one / two:.2f}x")


if __name__ == "__main__":
    main()
