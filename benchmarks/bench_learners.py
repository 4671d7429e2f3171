"""N learners on one machine, each running notebook 06's sweep at once: does the CPU budget keep the
machine's total throughput when the room fills up?

    python benchmarks/bench_learners.py                  # N = 1, 2, 4; both ways
    python benchmarks/bench_learners.py --learners 1 4 --microbatch-sizes 8 16

Each learner is its own process running ``ppkit pipeline`` (2 workers + the master: notebook 06's
sweep over micro-batch sizes, batch 32 of 64x64 images), all N started together. Two ways:

- ``all cores``: as before ppkit had a budget: every worker takes as many torch threads as the machine
  has cores (torch's default; OMP_NUM_THREADS and PPKIT_CPU_BUDGET = the machine's cores);
- ``budgeted``: every learner gets CPU_LIMIT = cores / N, as a JupyterHub spawner sets it, and ppkit
  gives each worker its share.

Throughput = images trained per second of the sweep (the timed steps, start-up excluded), summed
over the N learners. Printed: each N's aggregate and its ratio to N = 1's, for both ways, in one
run (target, issue 24: budgeted N=4 >= 0.8x N=1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCH, BATCHES = 32, 2


def images_per_second(output: str) -> float:
    """From ``ppkit pipeline``'s table: images over the seconds of its timed steps."""
    rows = [line.split() for line in output.splitlines() if line.strip()[:1].isdigit()]
    steps = [float(row[2]) for row in rows if len(row) >= 3]
    if not steps:
        raise RuntimeError(f"no result rows in:\n{output[-2000:]}")
    return BATCH * BATCHES * len(steps) / (BATCHES * sum(steps))


def run_learners(count: int, way: str, sizes: list[int]) -> list[float]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = {k: v for k, v in os.environ.items() if k not in ("CPU_LIMIT", "CPU_GUARANTEE", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if way == "all cores":  # torch's default before the budget: every worker as many threads as cores
        env["PPKIT_CPU_BUDGET"] = env["OMP_NUM_THREADS"] = str(cores)
    else:
        env.pop("PPKIT_CPU_BUDGET", None)
        env["CPU_LIMIT"] = f"{cores / count:g}"
    command = [sys.executable, "-m", "ppkit", "pipeline", "--batch-size", str(BATCH), "--num-batches", str(BATCHES),
               "--microbatch-sizes", *map(str, sizes)]
    learners = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(count)]
    outputs = [learner.communicate(timeout=1200)[0] for learner in learners]
    for learner, output in zip(learners, outputs):
        if learner.returncode != 0:
            raise RuntimeError(f"a learner failed ({learner.returncode}):\n{output[-2000:]}")
    return [images_per_second(output) for output in outputs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--microbatch-sizes", type=int, nargs="+", default=[8, 16, 32])
    args = parser.parse_args(argv)
    results: dict[str, dict[int, float]] = {"all cores": {}, "budgeted": {}}
    for count in args.learners:
        for way in results:  # the two ways alternate, so that a busy moment hits both
            started = time.monotonic()
            each = run_learners(count, way, args.microbatch_sizes)
            results[way][count] = sum(each)
            print(f"{count} learner(s), {way}: {sum(each):.1f} images/s in all ({', '.join(f'{x:.1f}' for x in each)}; "
                  f"{time.monotonic() - started:.0f} s)", file=sys.stderr)
    print(f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f} at the end; notebook 06's sweep "
          f"(batch {BATCH} of 64x64, micro-batch sizes {args.microbatch_sizes}, {BATCHES} timed steps each)\n")
    print("| learners at once | all cores: images/s, all | x one learner | budgeted: images/s | x one learner |")
    print("|---|---|---|---|---|")
    first = args.learners[0]
    for count in args.learners:
        a, b = results["all cores"][count], results["budgeted"][count]
        print(f"| {count} | {a:.1f} | {a / results['all cores'][first]:.2f} | {b:.1f} | "
              f"{b / results['budgeted'][first]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
