"""``python -m ppkit.cluster.slurm.reaper PID JOB [SRUN_PID]``: cancel SLURM job JOB when process
PID ends (inside an allocation, end the srun step SRUN_PID instead: the allocation is the user's).

The notebook cancels its job on close(), restart and exit; a kernel killed with SIGKILL runs none
of that. Running agents notice (their connection closes) and end the job's step, but a job still
pending would start later and wait for nobody. So the launcher starts this small watcher in its
own session, beside the kernel: when the kernel dies it runs ``scancel``; when the job ends first
it just exits.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from ppkit.cluster.slurm import commands

JOB_CHECK_S = 10.0


def _wait_for_exit(pid: int, seconds: float) -> bool:
    """True if ``pid`` ended within ``seconds``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux): poll instead
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.5)
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(seconds * 1000))
    finally:
        os.close(fd)


def _end_step(srun_pid: int) -> None:
    """SIGTERM to srun ends its step (srun forwards it to the tasks); SIGKILL if it lingers."""
    try:
        os.kill(srun_pid, signal.SIGTERM)
        if not _wait_for_exit(srun_pid, 5.0):
            os.kill(srun_pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(pid: int, job: str, srun_pid: int | None = None) -> None:
    while True:
        if _wait_for_exit(pid, JOB_CHECK_S):
            _end_step(srun_pid) if srun_pid else commands.cancel(job)
            return
        if srun_pid and _wait_for_exit(srun_pid, 0):
            return
        try:
            status = commands.status(job.split(".")[0])
        except Exception:  # noqa: BLE001 - squeue failed this time; the parent is what matters
            continue
        if status is None or status.ended:
            return


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
