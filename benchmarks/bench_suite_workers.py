"""`make test-fast` in one pytest against two pytest-xdist workers (`TEST_WORKERS`, tests/scheduling.py).

    python benchmarks/bench_suite_workers.py              # TEST_WORKERS=0, then TEST_WORKERS=2
    python benchmarks/bench_suite_workers.py --rounds 2

Runs `make test-fast` with each worker count in turn, ``--rounds`` times, so that a machine that gets busier or
quieter affects both. For each run it prints the wall time, pytest's summary line and how busy the machine's
cores were (/proc/stat over the run); then the ratio of the medians. Where the suite waits more than it computes,
two workers finish sooner than one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def run(workers: int) -> dict:
    busy0, total0 = cpu_times()
    start = time.monotonic()
    done = subprocess.run(["make", "test-fast", f"TEST_WORKERS={workers}", "PYTEST_ARGS=-q -p no:cacheprovider"],
                          cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - start
    busy1, total1 = cpu_times()
    lines = done.stdout.strip().splitlines()
    return {"wall": wall, "busy": (busy1 - busy0) / max(1, total1 - total0),
            "summary": lines[-1] if lines else done.stderr[-500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs per worker count (default 1)")
    args = parser.parse_args()
    if not Path("/proc/stat").exists():
        raise SystemExit("this benchmark reads /proc/stat for how busy the cores were: Linux only")
    print(f"{os.cpu_count()} cores; make test-fast")
    walls: dict[int, list[float]] = {0: [], 2: []}
    for _ in range(args.rounds):
        for workers in (0, 2):
            r = run(workers)
            walls[workers].append(r["wall"])
            print(f"-n {workers}: {r['wall']:7.1f} s, cores {r['busy']:.0%} busy; {r['summary']}", flush=True)
    one, two = statistics.median(walls[0]), statistics.median(walls[2])
    print(f"median wall time: one pytest {one:.1f} s, two workers {two:.1f} s; one / two = {one / two:.2f}x")


if __name__ == "__main__":
    main()
