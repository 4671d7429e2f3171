"""A worker that the kernel's out-of-memory killer ends is reported as out of memory, for real.

The test makes a memory cgroup with a limit (tests/memcg.py: this process's own cgroup's child; needs root),
starts a small program inside it that starts a ppkit cluster (so the fork server and the workers are in the
cgroup too, as a learner's are in theirs), and has one rank allocate past the limit. The kernel kills it;
the error the program catches must say out of memory, the limit, and what to do. Without a cgroup the test
skips, and under CI=true fails: the kill is never faked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from memcg import CgroupUnavailable, MemoryCgroup

REPO = Path(__file__).resolve().parents[1]
# Room for the program's, the fork server's and (ppkit.spawn) two fresh workers' torch, so that the rank that
# allocates is by far the largest process, the one the OOM killer picks; not room for a 4 GiB tensor.
LIMIT = 2560 * 2**20

HOG = textwrap.dedent("""
    import sys
    import ppkit

    def hog(rank, world_size):
        import torch
        if rank == 1:
            # The highest score there is: the OOM killer's first pick is certain, whatever else is in the group.
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
            chunks = [torch.ones(2**28, dtype=torch.uint8) for _ in range(16)]  # 4 GiB, touched
            return len(chunks)
        return 0

    def report(exc):
        print("CAUGHT", type(exc).__name__, exc.status, "\\n", exc, flush=True)
        sys.exit(0)
""")
IN_CLUSTER = HOG + textwrap.dedent("""
    with ppkit.Cluster(2, "gloo", timeout=120, start_timeout=120) as cluster:
        try:
            cluster.run(hog)
        except ppkit.WorkerDiedError as exc:
            report(exc)
    print("NO ERROR")
""")
IN_SPAWN = HOG + textwrap.dedent("""
    try:
        ppkit.spawn(hog, args=(2,), nprocs=2, timeout=120)
    except ppkit.WorkerDiedError as exc:
        report(exc)
    print("NO ERROR")
""")


def group_or_fail(name: str, limit: int) -> MemoryCgroup:
    try:
        return MemoryCgroup(name, limit_bytes=limit)
    except CgroupUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the OOM test needs a memory cgroup of its own (root, cgroup v1 memory or a delegated v2 "
                        f"memory controller): {exc}")
        pytest.skip(f"cannot make a memory cgroup here: {exc}")


def run_in(group: MemoryCgroup, script: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``script`` in a Python that first joins ``group`` (so all it starts is in the group too)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = ["sh", "-c", f'echo $$ > "{group.procs}" && exec "$@"', "sh", sys.executable, "-c", script]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def killed_for_memory(name: str, script: str, caught: str) -> tuple[str, str, Path]:
    """Run ``script`` in a new limited cgroup; the exit status it caught ("9" or "None"), what the program
    printed after catching ``caught``, and the cgroup's folder. Fails unless the kernel's OOM killer really
    killed something in it."""
    group = group_or_fail(name, LIMIT)
    try:
        done = run_in(group, script)
        kills = group.oom_kills()
    finally:
        group.close()
    output = done.stdout + done.stderr
    assert kills >= 1, f"the kernel's OOM killer killed nothing in {group.path}:\n{output[-3000:]}"
    assert done.returncode == 0 and f"CAUGHT {caught} " in done.stdout, output[-3000:]
    status = done.stdout.split(f"CAUGHT {caught} ", 1)[1].split(None, 1)[0]
    return status, done.stdout.split("CAUGHT", 1)[1], group.path


def assert_explains_out_of_memory(status: str, message: str) -> None:
    """The message is right for the outcome the kernel chose. The hog is its first pick (oom_score_adj 1000),
    but once memory is short the killer may go on to other processes of the group: a second worker, and the
    fork server that reports exit statuses (seen in CI: three kills, no status). Either way the message must
    say OUT OF MEMORY for the reason it can know."""
    assert "OUT OF MEMORY" in message and "2.5 GiB" in message and "docs/memory.md" in message, message
    if status == "9":  # SIGKILL's status, reported by the fork server
        assert "killed by signal SIGKILL" in message and "out-of-memory killer ended it" in message, message
    else:
        assert status == "None", f"an OOM kill must end with SIGKILL's status or none reported:\n{message}"
        assert "Its exit status was not reported" in message and "oom_kill count" in message, message


@pytest.mark.slow
def test_a_rank_killed_by_the_oom_killer_is_reported_as_out_of_memory(no_leftovers):
    status, message, where = killed_for_memory("oom", IN_CLUSTER, "WorkerDiedError")
    assert_explains_out_of_memory(status, message)
    assert "rank 1" in message or "rank 0" in message, message
    assert str(where) in message and "oom_kill count" in message
    assert "ask the instructor for more" in message


@pytest.mark.slow
def test_ppkit_spawn_says_out_of_memory_too(no_leftovers):
    status, message, _ = killed_for_memory("oom-spawn", IN_SPAWN, "ProcessExitedError")
    assert_explains_out_of_memory(status, message)
    assert "is the machine short of memory?" not in message  # the guess is replaced by what the cgroup said


def test_a_plain_sigkill_is_not_called_out_of_memory(no_leftovers):
    import ppkit
    from ppkit.cluster.oom import OomWatch

    if OomWatch.start().kills_at_start is None:
        pytest.skip("this process's cgroup has no oom_kill count to read")
    with ppkit.Cluster(2, "gloo", timeout=60) as cluster:
        with pytest.raises(ppkit.WorkerDiedError) as caught:
            cluster.run(_kill_rank_1)
    message = str(caught.value)
    assert "killed by signal SIGKILL" in message and caught.value.how in message
    assert "not by the out-of-memory killer" in message and "did not change" in message


def _kill_rank_1(rank, world_size):
    import signal
    import time

    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)
