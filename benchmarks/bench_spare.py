"""A new cluster's start with the spare fork server (ppkit/cluster/launchers/spare.py) against without it.

    python benchmarks/bench_spare.py                   # 8 starts per mode, gaps of 0 and 3 s
    python benchmarks/bench_spare.py --starts 12 --gaps 0 1 5

Each mode runs in a fresh Python process that imported torch, as a notebook kernel that did: ``ppkit.Cluster(2)``,
one ``run``, ``close()``, then ``--gap`` seconds of nothing (0: one cell right after another, as tests and a
"Run All" do; 3: a learner who re-runs a cell). "off" sets PPKIT_SPARE_S=0. The modes take turns, twice each, so a
machine that gets busier or quieter affects both. Prints the median start (the first start of each process, which no
spare can help, left out) and the ratio off / on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, sys, time
import torch, ppkit
starts, gap = int(sys.argv[1]), float(sys.argv[2])
times = []
for _ in range(starts + 1):
    t0 = time.perf_counter()
    cluster = ppkit.Cluster(2, "gloo", timeout=60)
    times.append(time.perf_counter() - t0)
    cluster.run(lambda rank, world_size: rank)
    cluster.close()
    time.sleep(gap)
print(json.dumps(times[1:]))
"""


def run(mode: str, starts: int, gap: float) -> list[float]:
    env = dict(os.environ, PPKIT_SPARE_S="0" if mode == "off" else "60")
    done = subprocess.run([sys.executable, "-c", CHILD, str(starts), str(gap)], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{mode} run failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=8, help="timed starts per process (default 8)")
    parser.add_argument("--gaps", type=float, nargs="+", default=[0.0, 3.0], help="seconds between starts")
    args = parser.parse_args()
    print("| gap between starts | starts per mode | median start, spare off (s) | median start, spare on (s) | "
          "off / on |")
    print("| --- | --- | --- | --- | --- |")
    for gap in args.gaps:
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(2):
            for mode in ("off", "on"):
                times[mode] += run(mode, args.starts, gap)
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        print(f"| {gap:g} s | {len(times['on'])} | {off:.2f} | {on:.2f} | {off / on:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
