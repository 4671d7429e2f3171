"""Soak: each of the DDP tutorial's demos run again and again with ppkit.spawn on the tutorial's fixed port.

    python benchmarks/bench_ddp_tutorial.py            # 20 runs of each demo (the suite runs 5)
    python benchmarks/bench_ddp_tutorial.py --runs 50

Not a timing: every run must print each rank's line and leave no process, on the same port as the last run
(tests/test_ddp_tutorial.py, with PPKIT_DDP_TUTORIAL_RUNS set). Prints each demo's first, median and slowest
run and exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each demo (default 20)")
    args = parser.parse_args()
    env = {**os.environ, "PPKIT_DDP_TUTORIAL_RUNS": str(args.runs)}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                            "tests/test_ddp_tutorial.py", "-k", "again_and_again"], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
