"""Soak: many ``cluster.run`` calls, a random rank killed now and then; every fault must end fast and clean.

    python benchmarks/bench_soak.py                       # 200 calls on 4 ranks, a rank SIGKILLed in 1 of 5
    python benchmarks/bench_soak.py --calls 50 --seed 3   # shorter, another draw

Not a timed benchmark: it checks properties, over and over (issue 17):

- a call whose rank is killed (SIGKILL, mid-job) raises ``WorkerDiedError`` within 5 s of the kill;
- ``restart()`` after it always succeeds, and every other call returns the right all_reduce;
- once the cluster is closed, nothing is left over: no child process (psutil), no thread
  (``threading.enumerate()``) and no file descriptor (``/proc/self/fd``) beyond those before it started.

Prints a short report and exits non-zero if any property failed. ``tests/test_cluster_soak.py``
runs a small version (10 calls, 2 kills) so that CI keeps the properties.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ppkit  # noqa: E402

DIED_WITHIN_S = 5.0
KILL_AFTER_S = 0.3  # into the job: the ranks are in it by then
SETTLE_S = 10.0  # how long leftovers get to go after close()


def all_reduce_job(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def blocked_job(rank, world_size):
    import time

    time.sleep(60)  # killed long before; the other ranks would wait for ever without ppkit


def snapshot() -> dict:
    """This process's children, threads and file descriptors, but for the spare fork server that a closed
    cluster leaves for the next one (ppkit/cluster/launchers/spare.py), what it keeps (slirp4netns, its
    private network's way out, on a shared machine) and its stdin pipe."""
    from ppkit.cluster.launchers import spare

    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, already closed
            pass
    fds.pop(spare.pipe_fd(), None)
    waiting = spare.pid()
    children = {p.pid: _command(p) for p in psutil.Process().children(recursive=True)
                if waiting is None or waiting not in (p.pid, _parent(p))}
    return {"children": {pid: command for pid, command in children.items() if command is not None},
            "threads": {t.ident: t.name for t in threading.enumerate()},
            "fds": fds}


def _command(process) -> str | None:
    """Its command line; None if it is gone meanwhile."""
    try:
        return " ".join(process.cmdline()[:4])
    except psutil.ZombieProcess:  # ended, not reaped yet: still a leftover, and named as one
        return "(a zombie: ended, not reaped)"
    except psutil.Error:
        return None


def _parent(process) -> int | None:
    try:
        return process.ppid()
    except psutil.Error:  # gone meanwhile
        return None


def leftovers(before: dict, settle: float = SETTLE_S) -> dict:
    """What exists now and did not before (waiting up to ``settle`` s for it to go)."""
    deadline = time.monotonic() + settle
    while True:
        now = snapshot()
        extra = {kind: {k: v for k, v in now[kind].items() if k not in before[kind]} for kind in now}
        if not any(extra.values()) or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def soak(calls: int = 200, world_size: int = 4, kill_every: int = 5, seed: int = 0,
         died_within: float = DIED_WITHIN_S, say=print) -> dict:
    """Run the soak; the report (counts, times, failures, leftovers) as a dict."""
    rng = random.Random(seed)
    killed_calls = set(rng.sample(range(calls), calls // kill_every))
    expected = [float(sum(range(1, world_size + 1)))] * world_size
    report = {"calls": calls, "world_size": world_size, "kills": 0, "died_errors": 0, "restarts": 0,
              "ok_calls": 0, "times_to_error": [], "failures": []}
    before = snapshot()
    cluster = ppkit.Cluster(world_size, "gloo", timeout=30)
    try:
        for call in range(calls):
            if call not in killed_calls:
                result = cluster.run(all_reduce_job)
                if result == expected:
                    report["ok_calls"] += 1
                else:
                    report["failures"].append(f"call {call}: all_reduce gave {result}, expected {expected}")
                continue
            victim = rng.randrange(world_size)
            pid = cluster.workers[victim]["pid"]
            killed_at = []

            def kill(pid=pid, killed_at=killed_at):
                time.sleep(KILL_AFTER_S)
                os.kill(pid, signal.SIGKILL)
                killed_at.append(time.monotonic())

            killer = threading.Thread(target=kill, name="soak-killer")
            killer.start()
            report["kills"] += 1
            try:
                cluster.run(blocked_job)
                report["failures"].append(f"call {call}: rank {victim} was killed but run() returned")
            except ppkit.WorkerDiedError as exc:
                took = time.monotonic() - killed_at[0] if killed_at else float("nan")
                report["died_errors"] += 1
                report["times_to_error"].append(took)
                if exc.ranks != [victim] or not took < died_within:
                    report["failures"].append(f"call {call}: WorkerDiedError for ranks {exc.ranks} "
                                              f"{took:.2f} s after rank {victim} was killed")
            except Exception as exc:  # noqa: BLE001 - any other ending is a failure to report
                report["failures"].append(f"call {call}: rank {victim} killed, got {type(exc).__name__}: "
                                          f"{str(exc)[:200]}")
            finally:
                killer.join()
            try:
                cluster.restart()
                report["restarts"] += 1
            except Exception as exc:  # noqa: BLE001
                report["failures"].append(f"call {call}: restart() failed: {type(exc).__name__}: {exc}")
                cluster.close()
                cluster = ppkit.Cluster(world_size, "gloo", timeout=30)
            if (call + 1) % 50 == 0:
                say(f"  ... {call + 1} calls", flush=True)
    finally:
        cluster.close()
    report["leftovers"] = leftovers(before)
    if any(report["leftovers"].values()):
        report["failures"].append(f"left over after close(): {report['leftovers']}")
    return report


def format_report(report: dict) -> str:
    times = report["times_to_error"]
    lines = [
        f"soak: {report['calls']} cluster.run calls on {report['world_size']} ranks, "
        f"{report['kills']} with a rank killed (SIGKILL)",
        f"  calls that returned the right all_reduce: {report['ok_calls']} of {report['calls'] - report['kills']}",
        f"  WorkerDiedError raised: {report['died_errors']} of {report['kills']}; restart() succeeded: "
        f"{report['restarts']} of {report['kills']}",
        ("  time from kill to error: median {:.2f} s, max {:.2f} s (limit {:.0f} s)".format(
            statistics.median(times), max(times), DIED_WITHIN_S) if times else "  no kills"),
        "  left over after close(): " + (", ".join(f"{len(v)} {k}" for k, v in report["leftovers"].items() if v)
                                         or "nothing (processes, threads, file descriptors)"),
    ]
    lines += [f"  FAILED {f}" for f in report["failures"][:20]]
    lines.append("PASS" if not report["failures"] else f"FAIL ({len(report['failures'])} problem(s))")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--kill-every", type=int, default=5, help="one call in this many has a rank killed")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    report = soak(args.calls, args.world_size, args.kill_every, args.seed)
    print(format_report(report))
    print(f"  ({time.monotonic() - started:.0f} s in all, seed {args.seed})")
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
