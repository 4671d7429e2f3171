"""Running a job on a cluster's ranks: ``cluster.run``'s jobs, and the last job of a process.

``run_to_exit`` is what ppkit.spawn and %%torchrun run on: each rank's process runs one job and then
ends as a script ends (transport/interpreter_exit.py), as mp.spawn's and torchrun's processes do.
"""

from __future__ import annotations

import contextlib

from ppkit.cluster.jobs import Job, check_job_function, new_cell_sources, pack_job


class JobRunning:
    """The cluster's methods that run jobs (mixed into ``Cluster``)."""

    def run_to_exit(self, fn, args: tuple, timeout: float | None, watch=None) -> list:
        """``fn(rank, world_size, *args)`` as each rank's last job: its process then ends as a script
        does (non-daemon threads joined, atexit handlers run), and an exit with status 0 is a success.
        ``timeout`` None: no limit; ``watch`` (a ``HangWatch``) then says once where ranks hang.
        What ppkit.spawn and %%torchrun run on; the cluster needs ``restart()`` afterwards."""
        try:
            return self._job(fn, args, {}, timeout, last=True, watch=watch)
        finally:
            self._break("its processes ran their last job.")

    @contextlib.contextmanager
    def profile(self, profile=True):
        """Every ``run`` in the block runs under torch.profiler on every rank; the ``Profile`` it gives
        is filled when the block ends (docs/profiling.md). ``profile=dict(record_shapes=True)`` adds shapes.

        >>> with cluster.profile() as prof:
        ...     cluster.run(train_step)
        >>> prof.summary()
        """
        from ppkit.profiling import clocks, collect
        from ppkit.profiling.profile import Profile

        options = collect.request(profile) or collect.Request()
        offsets = clocks.measure(self.run)
        prof = Profile()
        self.run(collect.start, options)
        try:
            yield prof
        except BaseException:  # a job of the block failed: the recording ends, and its error goes on
            with contextlib.suppress(Exception):
                self.run(collect.stop)
            raise
        values = self.run(collect.stop)
        prof._load({rank: v for rank, v in enumerate(values) if isinstance(v, dict)}, offsets)

    @property
    def generation(self) -> int:
        """How many times its workers were started anew (``restart()``): a kept rank belongs to one."""
        return self._generation

    def stop_workers_but(self, keep: tuple[int, ...], reason: str) -> None:
        """Stop every worker but ``keep``'s, SIGTERM then SIGKILL, as torchrun's agent stops the other
        ranks after a failure; ``keep``'s stay connected, for a post-mortem, until ``stop_kept``."""
        others = {rank: worker for rank, worker in self.workers.items() if rank not in keep}
        self._launcher.stop(others)
        for rank in others:
            conn = self._conns.pop(rank, None)
            if conn is not None:
                conn.close()
        self._break(reason)

    def stop_kept(self, generation: int) -> None:
        """Stop the workers ``stop_workers_but`` kept, if they are still this cluster's (``generation``)."""
        with self._one_job:  # not during a post-mortem on them
            if self.state != "closed" and self._generation == generation:
                self.stop_workers("the rank kept for %debug was released.")

    def _job(self, fn, args: tuple, kwargs: dict, timeout: float | None, **how) -> list:
        check_job_function(fn)
        with self._one_job:
            self._check_usable()
            job = Job(next(self._job_ids), self.world_size, self._inbox, self._send, self._launcher,
                      self._printer, self._break, self._conns, self.restart)
            return job.run(pack_job(fn, args, kwargs), new_cell_sources(self._sources_sent), timeout, self.workers,
                           **how)
