"""How long until N ranks are ready, measured against the cost of one ``import torch``.

    python benchmarks/bench_startup.py                 # 5 repetitions, 2 and 4 ranks
    python benchmarks/bench_startup.py --repeat 9 --sizes 2 4 8

Every start-up is timed in a fresh Python process, as a fresh notebook kernel would see it:

- floor: the wall time of ``python -c "import torch"``; no way of starting a torch rank is faster;
- ppkit, fresh kernel: ``import ppkit; ppkit.Cluster(N)`` in a kernel that has not imported torch;
- ppkit, kernel that imported torch: the same, after ``import torch`` (a notebook usually has);
- the same two with ``start_method="spawn"`` (each rank a fresh interpreter: macOS, Windows);
- with ``--slurm NODES``: ``ppkit.Cluster(N, launcher="slurm", nodes=NODES)`` in a fresh kernel, from
  sbatch until every rank is ready, on the SLURM that SLURM_CONF points at (idle, for a fair number),
  with its ratio to the local launcher's fresh-kernel start in the same rounds (target, issue 22: <= 2x);
- mp.spawn: ``torch.multiprocessing.spawn`` of N processes that each call
  ``init_process_group("gloo")`` over loopback (FileStore), timed from the spawn call until the last
  rank has joined, in a parent that already imported torch.

Then, on a warm cluster: the median round trip of ``cluster.run`` of a function that does nothing,
and the time ``cluster.restart()`` takes. Prints a markdown table; ratios are to the floor.
Targets (issue 2): 4 ranks ready within 1.5x the floor; round trip <= 20 ms.

Last, ``ppkit.spawn`` against ``mp.spawn``: each called 10 times in a row (``--spawn-calls``) on 4
processes running a function that does nothing, from a fresh script that imported torch, the first
ppkit call included (it starts the fork server); ``mp.spawn`` with its default start method,
spawn, as tutorials call it. Target (issue 26): ppkit.spawn >= 5x faster. ``--spawn-only`` runs
just this comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BACKENDS_USED: set[str] = set()

PPKIT_CHILD = """
import json, time
{preload}
t0 = time.monotonic()
import ppkit
cluster = ppkit.Cluster({world_size}, {backend!r}, **{options!r})
ready = time.monotonic() - t0
cluster.close()
print(json.dumps([ready, cluster.backend]))
"""


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    return env


def run_child(args: list[str]) -> tuple[float, str]:
    start = time.monotonic()
    out = subprocess.run([sys.executable, *args], env=child_env(), cwd=REPO, check=True,
                         capture_output=True, text=True, timeout=300)
    return time.monotonic() - start, out.stdout


def floor() -> float:
    return run_child(["-c", "import torch"])[0]


def ppkit_ready(world_size: int, backend: str, warm_kernel: bool, start_method: str = "forkserver", **options) -> float:
    options = options or {"start_method": start_method}
    code = PPKIT_CHILD.format(preload="import torch" if warm_kernel else "", world_size=world_size,
                              backend=backend, options=options)
    ready, used = json.loads(run_child(["-c", code])[1].strip().splitlines()[-1])
    BACKENDS_USED.add(used)
    return ready


def mp_spawn_ready(world_size: int) -> float:
    return json.loads(run_child([__file__, "--mp-spawn-child", str(world_size)])[1].strip().splitlines()[-1])


# -- the mp.spawn baseline, run as a child of this benchmark -----------------------------------------
def _spawned_rank(rank: int, world_size: int, store_path: str, joined) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    joined.put(time.monotonic())  # CLOCK_MONOTONIC is one clock for every process on the machine
    dist.barrier()
    dist.destroy_process_group()


def mp_spawn_child(world_size: int) -> None:
    import torch.multiprocessing as mp

    joined = mp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        mp.spawn(_spawned_rank, args=(world_size, os.path.join(tmp, "store"), joined), nprocs=world_size)
        last = max(joined.get() for _ in range(world_size))
    print(json.dumps(last - start))


# -- ppkit.spawn vs mp.spawn, each called again and again from a script ----------------------------
def _trivial(i):
    return None


def spawn_calls_child(kind: str, nprocs: int, calls: int) -> None:
    """Time ``calls`` calls of ``kind`` ("ppkit" or "mp") in this fresh script; print the times."""
    import torch  # noqa: F401  (a tutorial's script, like a notebook, has imported torch)

    if kind == "ppkit":
        import ppkit

        spawn = ppkit.spawn
    else:
        import torch.multiprocessing as mp

        spawn = mp.spawn
    times = []
    for _ in range(calls):
        start = time.monotonic()
        spawn(_trivial, nprocs=nprocs, join=True)
        times.append(time.monotonic() - start)
    print(json.dumps(times))


def spawn_numbers(nprocs: int, calls: int) -> None:
    runs = {kind: json.loads(run_child([__file__, "--spawn-child", kind, str(nprocs), str(calls)])[1]
                             .strip().splitlines()[-1]) for kind in ("ppkit", "mp")}
    print(f"| {calls} calls in a row, {nprocs} processes, a function that does nothing | total (s) "
          "| first call (s) | median call (s) |")
    print("|---|---|---|---|")
    for kind, label in (("ppkit", "`ppkit.spawn` (fork server; the first call starts it)"),
                        ("mp", "`mp.spawn` (start method spawn, its default)")):
        times = runs[kind]
        print(f"| {label} | {sum(times):.2f} | {times[0]:.2f} | {statistics.median(times):.3f} |")
    print(f"\nppkit.spawn is {sum(runs['mp']) / sum(runs['ppkit']):.1f}x faster over the {calls} calls "
          f"({statistics.median(runs['mp']) / statistics.median(runs['ppkit']):.0f}x per call once started); "
          "target >= 5x")


# -- warm cluster ------------------------------------------------------------------------------------
def _nothing(rank, world_size):
    return None


def warm_numbers(world_size: int, backend: str, round_trips: int, restarts: int):
    import ppkit

    with ppkit.Cluster(world_size, backend) as cluster:
        for _ in range(20):
            cluster.run(_nothing)
        times = []
        for _ in range(round_trips):
            start = time.perf_counter()
            cluster.run(_nothing)
            times.append(time.perf_counter() - start)
        restart_times = []
        for _ in range(restarts):
            start = time.monotonic()
            cluster.restart()
            restart_times.append(time.monotonic() - start)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], statistics.median(restart_times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="start-ups per measurement (median)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4], help="world sizes to time")
    parser.add_argument("--backend", default="auto", help="ppkit's backend (mp.spawn always uses gloo)")
    parser.add_argument("--round-trips", type=int, default=200, help="cluster.run calls timed")
    parser.add_argument("--slurm", type=int, metavar="NODES", help="also time launcher='slurm' on NODES nodes")
    parser.add_argument("--spawn-calls", type=int, default=10, help="calls of ppkit.spawn and mp.spawn timed")
    parser.add_argument("--spawn-only", action="store_true", help="only compare ppkit.spawn with mp.spawn")
    parser.add_argument("--mp-spawn-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--spawn-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mp_spawn_child:
        mp_spawn_child(args.mp_spawn_child)
        return 0
    if args.spawn_child:
        kind, nprocs, calls = args.spawn_child
        spawn_calls_child(kind, int(nprocs), int(calls))
        return 0
    if args.spawn_only:
        spawn_numbers(4, args.spawn_calls)
        return 0

    import torch

    floor_label = '`python -c "import torch"` (the floor)'
    measurements = [(floor_label, 1, floor)]
    for n in args.sizes:
        for method in ("forkserver", "spawn"):
            measurements += [
                (f"`ppkit.Cluster({n}, start_method={method!r})`, fresh kernel", n,
                 lambda n=n, m=method: ppkit_ready(n, args.backend, warm_kernel=False, start_method=m)),
                (f"`ppkit.Cluster({n}, start_method={method!r})`, kernel that imported torch", n,
                 lambda n=n, m=method: ppkit_ready(n, args.backend, warm_kernel=True, start_method=m)),
            ]
        for warm in (False, True) if args.slurm else ():
            kernel = "kernel that imported torch" if warm else "fresh kernel"
            measurements.append((f"`ppkit.Cluster({n}, launcher='slurm', nodes={args.slurm})`, {kernel}", n,
                                 lambda n=n, w=warm: ppkit_ready(n, "gloo", w, launcher="slurm", nodes=args.slurm)))
        measurements += [
            (f"`mp.spawn({n})` + `init_process_group` (gloo), parent that imported torch", n,
             lambda n=n: mp_spawn_ready(n)),
        ]
    # Rounds interleave the measurements, and each ratio is taken within its round, so that a
    # busy moment on a shared machine hits the floor and what is compared with it alike.
    runs: dict[str, list[float]] = {label: [] for label, _, _ in measurements}
    for round_ in range(args.repeat):
        for label, _, measure in measurements:
            runs[label].append(measure())
        print(f"round {round_ + 1}/{args.repeat}: "
              + ", ".join(f"{values[-1]:.2f}" for values in runs.values()), file=sys.stderr)

    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPU cores, "
          f"load average {os.getloadavg()[0]:.1f} at the end; ppkit backend "
          f"{'/'.join(sorted(BACKENDS_USED))}; medians of {args.repeat} rounds\n")
    print("| start-up, until every rank is ready | ranks | median (s) | x floor (median of rounds) "
          "| every round (s) |")
    print("|---|---|---|---|---|")
    floor_runs = runs[floor_label]
    for label, n, _ in measurements:
        values = runs[label]
        ratio = statistics.median(v / f for v, f in zip(values, floor_runs))
        print(f"| {label} | {n} | {statistics.median(values):.2f} | {ratio:.2f} | "
              f"{' '.join(f'{v:.2f}' for v in values)} |")
    for n in args.sizes if args.slurm else ():
        for kernel in ("fresh kernel", "kernel that imported torch"):
            slurm = runs[f"`ppkit.Cluster({n}, launcher='slurm', nodes={args.slurm})`, {kernel}"]
            local = runs[f"`ppkit.Cluster({n}, start_method='forkserver')`, {kernel}"]
            print(f"\n{n} ranks: launcher='slurm' on {args.slurm} node(s) / local launcher, {kernel}, median of "
                  f"rounds: {statistics.median(a / b for a, b in zip(slurm, local)):.2f}x (target <= 2x)")
    print()
    print(f"| warm cluster ({args.backend}) | ranks | median | p90 |")
    print("|---|---|---|---|")
    for n in args.sizes:
        median, p90, restart = warm_numbers(n, args.backend, args.round_trips, restarts=max(3, args.repeat))
        print(f"| `cluster.run` round trip, function that does nothing ({args.round_trips} calls) | {n} "
              f"| {median * 1e3:.2f} ms | {p90 * 1e3:.2f} ms |")
        print(f"| `cluster.restart()` | {n} | {restart:.2f} s | |")
    print()
    spawn_numbers(4, args.spawn_calls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
