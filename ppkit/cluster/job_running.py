"""Running jobs on a cluster's ranks: the job runner a ``Cluster`` owns, and runs under the profiler.

A ``JobRunner`` runs one job at a time (jobs.py: one ``Job`` per ``run``). The cluster hands it its
``RankLinks`` (links.py) and four callables: ``check_usable()`` before each job, ``on_break(reason)``
when a job leaves ranks that need a restart, ``restart()`` after a pdb quit left ranks blocked, and
``workers()``, the current workers' info. It reads nothing else of the cluster. A job with ``last=True``
is what ppkit.spawn and %%torchrun run on: each rank's process runs it and then ends as a script ends
(transport/interpreter_exit.py), as mp.spawn's and torchrun's processes do.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable

from ppkit.cluster.faults import arming as faults
from ppkit.cluster.job_payload import check_job_function, new_cell_sources, pack_job
from ppkit.cluster.jobs import Job
from ppkit.cluster.links import RankLinks
from ppkit.errors import JobInterrupted, WorkerError


class JobRunner:
    """Runs a cluster's jobs, one at a time (a widget's callback may call ``run`` from another thread)."""

    def __init__(self, links: RankLinks, *, check_usable: Callable[[], None], on_break: Callable[[str], None],
                 restart: Callable[[], object], workers: Callable[[], dict]):
        self._links = links
        self._check_usable = check_usable
        self._on_break = on_break
        self._restart = restart
        self._workers = workers
        self._job_ids = itertools.count(1)
        self._sources_sent: set[str] = set()  # the notebook cells whose source the ranks have
        self._one_job = threading.Lock()
        self.last_results: dict = {}  # rank -> its answer to the last job (Result or Cancelled), if it answered
        self.last_diagnosis = None  # the collective doctor's last reading of the last job, if it read one

    def exclusive(self) -> threading.Lock:
        """``with runner.exclusive():`` no job runs meanwhile (a post-mortem, stopping a kept rank)."""
        return self._one_job

    def new_ranks(self) -> None:
        """The ranks were started anew: they have no notebook cell's source yet."""
        self._sources_sent = set()
        self.last_results = {}
        self.last_diagnosis = None

    def run(self, fn, args: tuple, kwargs: dict, timeout: float | None, *, last: bool = False, watch=None) -> list:
        """``fn(rank, world_size, *args, **kwargs)`` on every rank; its values by rank, or the job's error.
        ``last``: each rank's process then ends as a script does; ``watch`` (a ``HangWatch``) says once
        where ranks hang when ``timeout`` is None."""
        check_job_function(fn)
        links = self._links
        with self._one_job:
            self._check_usable()
            faults.forget()
            fn = faults.carried(fn, links.world_size)  # a fault ppkit.fail_rank armed goes with the job
            job = Job(next(self._job_ids), links.world_size, links.inbox, links.send, links.launcher,
                      links.printer, self._on_break, links.conns, self._restart)
            try:
                # ppkit.log_metrics from the ranks: a live plot; ppkit.fail_rank: kill one of these ranks now
                with links.printer.metrics.job(job.job_id), faults.running(self._workers(), fn):
                    return job.run(pack_job(fn, args, kwargs), new_cell_sources(self._sources_sent), timeout,
                                   self._workers(), last=last, watch=watch)
            except (WorkerError, JobInterrupted) as exc:
                faults.explain(exc)  # a rank failed on purpose: the error says so
                raise
            finally:
                self.last_results = dict(job.results)  # the doctor on demand: a rank that raised is not computing
                self.last_diagnosis = job.diagnosis


@contextlib.contextmanager
def profiled(run, profile=True):
    """``Cluster.profile``: every ``run`` in the block runs under torch.profiler on every rank; the
    ``Profile`` it gives is filled when the block ends (docs/profiling.md)."""
    from ppkit.profiling import clocks, collect
    from ppkit.profiling.profile import Profile

    options = collect.request(profile) or collect.Request()
    offsets = clocks.measure(run)
    prof = Profile()
    run(collect.start, options)
    try:
        yield prof
    except BaseException as exc:  # a job of the block failed: what was recorded is kept, and its error goes on
        try:
            values = run(collect.stop)
        except Exception as stop_error:  # noqa: BLE001 - the block's error is the one to raise
            why = (f"the block raised {type(exc).__name__} and the recording could not be collected after it "
                   f"({type(stop_error).__name__}: {str(stop_error).splitlines()[0] if str(stop_error) else ''})")
            prof._load({}, offsets, missing={rank: why for rank in sorted(offsets)})
        else:
            results, missing = collect.recorded(values)
            prof._load(results, offsets, world_size=len(values), missing=missing)
        raise
    results, missing = collect.recorded(run(collect.stop))
    prof._load(results, offsets, world_size=len(results) + len(missing), missing=missing)
