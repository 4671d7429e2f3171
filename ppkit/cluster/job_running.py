"""Running a job on a cluster's ranks: ``cluster.run``'s jobs, and the last job of a process.

``run_to_exit`` is what ppkit.spawn and %%torchrun run on: each rank's process runs one job and then
ends as a script ends (transport/interpreter_exit.py), as mp.spawn's and torchrun's processes do.
"""

from __future__ import annotations

from ppkit.cluster.jobs import Job, check_job_function, new_cell_sources, pack_job


class JobRunning:
    """The cluster's methods that run jobs (mixed into ``Cluster``)."""

    def run_to_exit(self, fn, args: tuple, timeout: float | None, watch=None) -> list:
        """``fn(rank, world_size, *args)`` as each rank's last job: its process then ends as a script
        does (non-daemon threads joined, atexit handlers run), and an exit with status 0 is a success.
        ``timeout`` None: no limit; ``watch`` (a ``HangWatch``) then says once where ranks hang.
        What ppkit.spawn and %%torchrun run on; the cluster needs ``restart()`` afterwards."""
        check_job_function(fn)
        try:
            return self._job(fn, args, {}, timeout, last=True, watch=watch)
        finally:
            self._break("its processes ran their last job.")

    def _job(self, fn, args: tuple, kwargs: dict, timeout: float | None, **how) -> list:
        with self._one_job:
            self._check_usable()
            job = Job(next(self._job_ids), self.world_size, self._inbox, self._send, self._launcher,
                      self._printer, self._break, self._conns, self.restart)
            return job.run(pack_job(fn, args, kwargs), new_cell_sources(self._sources_sent), timeout, self.workers,
                           **how)
