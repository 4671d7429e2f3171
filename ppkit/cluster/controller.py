"""The Cluster: a world of worker processes driven from the notebook kernel.

The kernel is the *controller*: it listens on an authenticated control channel, a launcher (launchers/, chosen by
name) starts one worker per rank, and every worker connects back. What they say arrives in one inbox (inbox.py), read
in the thread that called ``start``/``run``, so output lands in the right cell. Here: the state machine (starting,
ready, broken, closed) and the public methods. The Cluster owns two parts, each handed the ranks' ``RankLinks``
(links.py) and only what else it needs: its job runner (job_running.py) and its post-mortems
(debug/post_mortem.py). Errors are worded in diagnostics.py.
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from dataclasses import asdict

from ppkit.checks import positive
from ppkit.cluster import diagnostics, hang_doctor, hang_watch, launchers, worker_setup
from ppkit.cluster.admission import handle_probe, listen_error
from ppkit.cluster.budget import read_budget
from ppkit.cluster.debug import post_mortem
from ppkit.cluster.hang_watch import HangWatch
from ppkit.cluster.inbox import Closed, Inbox, Item
from ppkit.cluster.job_running import JobRunner, profiled
from ppkit.cluster.launchers import Process
from ppkit.cluster.links import RankLinks
from ppkit.cluster.output import RankPrinter
from ppkit.cluster.spec import DEFAULT_START_TIMEOUT_S, DEFAULT_TIMEOUT_S, ClusterSpec, cluster_spec
from ppkit.errors import ClusterStateError, LaunchError
from ppkit.transport import channel, sending
from ppkit.transport.messages import Hello, Init, JoinFailed, Output, Probe, Ready, Reject, Shutdown
from ppkit.transport.metrics import Metrics

CONTROL_SEND_S = 2.0  # a control message (cancel, shutdown, ...) to a rank that reads nothing
_live_clusters: weakref.WeakSet[Cluster] = weakref.WeakSet()


class Cluster:
    """A world of ``world_size`` ranks, each a background worker process.

    >>> with Cluster(2) as cluster:
    ...     cluster.run(lambda rank, world_size: rank * 10)
    [0, 10]

    ``run(fn, *args)`` calls ``fn(rank, world_size, *args)`` on every rank at once; ``fn`` may be
    defined in a notebook cell (it is shipped by value with cloudpickle).

    ``launcher`` says where the ranks run (ppkit/cluster/launchers/): "local" (default), "spawn",
    "remote" (``listen="10.0.0.1:29600", remote=["worker1"]`` waits for ``ppkit worker``) or
    "slurm" (``nodes``, ``partition``, ``time``, ``sbatch_args``: ranks are SLURM tasks). ``isolation``:
    the local launcher's workers in a private network, "auto", "netns" or "off" (isolation.py).
    """

    def __init__(self, world_size: int, backend: str = "auto", *, timeout: float = DEFAULT_TIMEOUT_S,
                 start_timeout: float = DEFAULT_START_TIMEOUT_S, process_group: bool = True,
                 env: dict[str, str] | None = None, labels: list[str] | None = None,
                 listen: str | None = None, remote=None, key: bytes | str | None = None,
                 start_method: str = "auto", launcher: str | None = None, nodes: int | None = None,
                 partition: str | None = None, time: str | None = None, sbatch_args=(), isolation: str = "auto"):
        self._begin(cluster_spec(world_size, backend, timeout=timeout, start_timeout=start_timeout,
                                 process_group=process_group, env=env, labels=labels, listen=listen,
                                 remote=remote, key=key, start_method=start_method, launcher=launcher,
                                 nodes=nodes, partition=partition, time=time, sbatch_args=sbatch_args,
                                 isolation=isolation))

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Cluster:
        """A cluster started from options already checked (``spec.cluster_spec``)."""
        cluster = cls.__new__(cls)
        cluster._begin(spec)
        return cluster

    def _begin(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.world_size = spec.world_size
        # 'auto' counts GPUs, which imports torch (seconds): done below, while the fork server imports it too
        self.backend = spec.backend  # "gloo" or "nccl" already checked (nccl's GPUs counted) by the spec
        self.timeout = spec.timeout
        self.start_timeout = spec.start_timeout
        self.process_group = spec.process_group
        self.state = "starting"
        self._broken_reason = ""
        self._generation = 0  # how many times the workers were started anew
        self.isolation = None
        self._pid = os.getpid()  # the process that owns the workers (see _close_all)
        self.workers: dict[int, dict] = {}
        self._key = spec.key or channel.new_key()
        self._printer = RankPrinter(list(spec.labels) if spec.labels else None, spec.world_size)  # "rank N"
        self._inbox = Inbox(self._routine, output=self._printer)
        self._conns: dict[int, object] = {}  # rank -> this generation's connection
        self._launcher = launchers.create(spec, self._inbox, self._key)
        links = RankLinks(spec.world_size, self._inbox, self._send, self._conns, self._launcher, self._printer)
        self._jobs = JobRunner(links, check_usable=self._check_usable, on_break=self._break, restart=self.restart,
                               workers=lambda: self.workers)
        self._post_mortems = post_mortem.PostMortems(links)
        host, port = self._launcher.server_address()
        try:
            self._server = channel.ChannelServer(host, port, self._key, self._greet)
        except OSError as exc:
            raise listen_error(exc, host, port) from exc
        self._env = {**self._launcher.local_env(), **spec.env_dict}
        self.budget = read_budget()  # each local worker's torch threads: its share, unless the learner set them
        self._threads = self.budget.threads_per_worker(len(self._launcher.local_ranks), self._env)
        self.address = self._server.address
        self._launcher.bind(self.address, self._greet)
        _live_clusters.add(self)
        try:
            if self.backend == "auto":
                self._launcher.prepare()
                self.backend = worker_setup.resolve_backend("auto", self.world_size)
            self._start_workers()
        except BaseException:
            self.close()
            raise

    # -- what rpc_world and other layers above ask ----------------------------------------------
    def local_env(self) -> dict[str, str]:
        """Environment that puts a process of this machine on the cluster's network (gloo, MASTER_ADDR)."""
        return self._launcher.local_env()

    def rendezvous_url(self, name: str) -> str:
        """A fresh ``init_method`` URL for a rendezvous that this machine's process hosts."""
        return self._launcher.rendezvous_url(name)

    def printing(self, settings=None):
        """``with cluster.printing(settings):`` a run's output as ``output.OutputSettings`` say (None: plain)."""
        return self._printer.use(settings)

    def stop_workers(self, reason: str) -> None:
        """Stop the workers but not the cluster, quietly; ``run`` then asks for ``restart()``."""
        self._kill_workers(quiet=True)
        self._break(reason)

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
        with self._jobs.exclusive():  # not during a post-mortem on them
            if self.state != "closed" and self._generation == generation:
                self.stop_workers("the rank kept for %debug was released.")

    # -- connections (each in its own thread) ---------------------------------------------------
    def _greet(self, conn) -> None:
        try:
            first = conn.recv()
        except (EOFError, OSError):
            conn.close()
            return
        if isinstance(first, Hello):
            generation = self._generation  # the workers this connection belongs to
            rank = first.info.rank
            if not isinstance(rank, int) or not 0 <= rank < self.world_size:
                conn.send(Reject(f"this cluster has ranks 0..{self.world_size - 1}, not {rank!r}"))
                conn.close()
                return
            config = worker_setup.worker_config(rank, self.world_size, self.backend, self.process_group, self._env,
                                                self.start_timeout, self._threads)
            conn.send(Init(self._launcher.init_config(rank, config, generation)))
            self._conns[rank] = conn
            self._inbox.read(conn, rank, generation)
        elif isinstance(first, Probe):
            handle_probe(conn)
        elif not self._launcher.accept(conn, first):
            conn.close()

    def _send(self, rank: int, msg) -> bool:
        return sending.send_within(self._conns.get(rank), msg, CONTROL_SEND_S)

    # -- the inbox ------------------------------------------------------------------------------
    def _routine(self, item: Item) -> bool:
        """Print output and note exit reports; True if ``item`` needs nothing more."""
        if isinstance(item.msg, Output):
            if item.generation == self._generation:
                self._printer.write(item.source, item.msg.stream, item.msg.text)
            return True
        if isinstance(item.msg, Metrics):
            if item.generation == self._generation:
                self._printer.metrics.add(item.source, item.msg)
            return True
        if item.from_launcher:
            return self._launcher.note(item)
        return item.generation != self._generation  # a previous generation's news

    def _next(self, deadline: float, ready: set[int]) -> Item:
        """The next item that needs the start loop; ``LaunchError`` at ``deadline``."""
        item = self._inbox.next(deadline)
        if item is None:
            self._printer.flush()
            raise diagnostics.start_timed_out(self.start_timeout, self._launcher.describe_missing(ready),
                                              self._launcher.timeout_hint(ready))
        lost = self._launcher.lost(item) if item.from_launcher else None
        if lost is not None and lost.rank not in ready:  # refused, or gone
            raise LaunchError(lost.reason)
        return item

    def _drain(self) -> None:
        """Take in what arrived between calls: a rank or the fork server that died breaks the cluster."""
        while (item := self._inbox.next(None)) is not None:
            lost = self._launcher.lost(item) if item.from_launcher else None
            if lost is not None and self.state in ("ready", "broken"):  # a machine lost between jobs
                self._break(lost.reason)
            elif isinstance(item.msg, Closed) and self.state == "ready" and not item.from_launcher:
                # a rank died between jobs
                rank = item.source
                self._launcher.wait_exit_status(rank)
                self._break(f"rank {rank} (pid {self.workers.get(rank, {}).get('pid')}) died while no job "
                            f"was running: {self._launcher.describe_exit(rank)}.")

    # -- start, restart, close ----------------------------------------------------------------
    def _start_workers(self) -> None:
        self.state = "starting"
        self.workers = {}
        self._jobs.new_ranks()
        deadline = time.monotonic() + self.start_timeout
        ready: set[int] = set()
        self._launcher.begin()
        while not self._launcher.can_spawn():
            self._next(deadline, ready)
        self._launcher.spawn()
        while len(ready) < self.world_size:
            item = self._next(deadline, ready)
            if isinstance(item.msg, Ready):
                self.workers[item.source] = asdict(item.msg.info)  # a dict: what users index
                ready.add(item.source)
            elif isinstance(item.msg, JoinFailed):
                self._printer.flush()
                raise diagnostics.join_failed(item.source, item.msg.error, self._launcher.join_failed_hint())
            elif isinstance(item.msg, Closed) and not item.from_launcher:
                time.sleep(0.2)
                self._drain()
                raise diagnostics.died_while_starting(item.source, self._launcher.describe_exit(item.source))
        self.workers = dict(sorted(self.workers.items()))
        self._printer.flush()
        self._launcher.end_start()
        self.isolation = self._launcher.isolation()  # can other users reach the workers? (isolation.py)
        self.state = "ready"

    def restart(self) -> Cluster:
        """Kill every worker and start a clean world with the same settings (the kernel stays)."""
        if self.state == "closed":
            raise ClusterStateError("this cluster is closed; start a new one with ppkit.start(...).")
        self._kill_workers()
        self._generation += 1
        try:
            self._start_workers()
        except BaseException:
            self.close()
            raise
        return self

    def _kill_workers(self, quiet: bool = False) -> None:
        """Stop this generation's workers; ``quiet`` drops what they print while dying."""
        if quiet:
            self._generation += 1
        for rank in list(self._conns):
            self._send(rank, Shutdown())
        self._launcher.stop(self.workers)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        self._drain()

    def _break(self, reason: str) -> None:
        self.state = "broken"
        self._broken_reason = reason

    def close(self) -> None:
        """Stop every worker and the fork server. Safe to call twice."""
        if self.state == "closed":
            return
        self.state = "closed"
        self._kill_workers()
        self._launcher.close()
        self._server.close()
        _live_clusters.discard(self)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running jobs ---------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn(rank, world_size, *args, **kwargs)`` on every rank; return results by rank.

        Raises ``RemoteError`` if any rank raised, ``WorkerDiedError`` if a rank died and
        ``JobTimeoutError`` (with where each rank waits) after ``timeout`` seconds. One job at a time:
        a widget's callback may call this from another thread of the kernel (JupyterLab's subshells).
        """
        return self._jobs.run(fn, args, kwargs, self.timeout if timeout is None else positive(timeout, "timeout"))

    def run_watched(self, fn, *args, timeout: float | None = None) -> list:
        """``run`` with a hang watch (hang_watch.py): a job that seems hung is shown once, with the collective
        doctor's reading and where each rank waits, before its timeout ends it (a timeout that comes first
        says the same). What ``%%ranks`` runs on."""
        timeout = self.timeout if timeout is None else positive(timeout, "timeout")
        seconds = hang_watch.threshold()
        watch = HangWatch(seconds) if seconds and seconds < timeout else None
        return self._jobs.run(fn, args, {}, timeout, watch=watch)

    def run_to_exit(self, fn, args: tuple, timeout: float | None, watch=None) -> list:
        """``fn(rank, world_size, *args)`` as each rank's last job: its process then ends as a script
        does (non-daemon threads joined, atexit handlers run), and an exit with status 0 is a success.
        ``timeout`` None: no limit; ``watch`` (a ``HangWatch``) then says once where ranks hang.
        What ppkit.spawn and %%torchrun run on; the cluster needs ``restart()`` afterwards."""
        try:
            return self._jobs.run(fn, args, {}, timeout, last=True, watch=watch)
        finally:
            self._break("its processes ran their last job.")

    def profile(self, profile=True):
        """Every ``run`` in the block runs under torch.profiler on every rank; the ``Profile`` it gives
        is filled when the block ends (docs/profiling.md). ``profile=dict(record_shapes=False)`` leaves out shapes.

        >>> with cluster.profile() as prof:
        ...     cluster.run(train_step)
        >>> prof.summary()
        """
        return profiled(self.run, profile)

    def debug(self, rank: int | None = None) -> None:
        """Open pdb on ``rank`` at the frame that raised in the last job, with its locals.

        ``rank`` defaults to the first rank of the last error IPython saw (``sys.last_value``).
        ``c`` or ``q`` ends the session; the rank keeps its traceback until its next job.

        >>> cluster.run(train)      # RemoteError: rank 1 raised RuntimeError ...
        >>> cluster.debug()         # (Pdb rank 1) p x.shape
        """
        rank = post_mortem.rank_to_debug(rank, self.world_size)
        with self._jobs.exclusive():
            if self.state == "closed":
                raise ClusterStateError("this cluster is closed: its ranks and their tracebacks are gone.")
            self._post_mortems.open(rank, self._generation)

    def flight_records(self, wait: float = hang_doctor.WAIT_S) -> dict[int, dict]:
        """rank -> its flight record now (ppkit/cluster/hang_doctor/: what ``ppkit.collective_doctor`` reads),
        for each rank that answers within ``wait`` s. Not while a job runs (from another thread): it would
        take that job's messages from the inbox; its hang watch and timeout call the doctor themselves."""
        lock = self._jobs.exclusive()
        if not lock.acquire(timeout=1):
            raise ClusterStateError("a job is running on this cluster (from another thread), so its ranks' records "
                                    "cannot be asked now: its hang watch and its timeout call the collective doctor "
                                    "themselves. Ask again once it ends.")
        try:
            return hang_doctor.ask_records(self._send, self._inbox, range(self.world_size), wait=wait)
        finally:
            lock.release()

    @property
    def last_job_results(self) -> dict:
        """rank -> its answer to this cluster's last job (a Result or Cancelled), for each rank that answered;
        empty after a restart. The collective doctor on demand reads how each rank's job ended."""
        return dict(self._jobs.last_results)

    @property
    def last_job_diagnosis(self):
        """The collective doctor's last reading of this cluster's last job (its hang watch's, its error's, or,
        after a last job that completed, the check of the records its ranks sent as they ended); None if none."""
        return self._jobs.last_diagnosis

    def _check_usable(self) -> None:
        if self.state == "closed":
            raise ClusterStateError("this cluster is closed. Start a new one: cluster = ppkit.start(N).")
        self._launcher.settle()
        self._drain()
        if self.state == "broken":
            raise diagnostics.needs_restart(self._broken_reason)

    @property
    def slurm_script(self) -> str:
        """The batch script (or srun command) the SLURM launcher ran; "" for the other launchers."""
        return self._launcher.script()

    def processes(self) -> list[Process]:
        """Its launcher's processes (fork server, agents, SLURM job) and each rank's worker, each named once."""
        workers = [Process("worker", w["pid"], rank, w["host"]) for rank, w in sorted(self.workers.items())]
        return [p for p in self._launcher.processes() if p.pid not in {w.pid for w in workers}] + workers

    # -- display ------------------------------------------------------------------------------
    def __repr__(self) -> str:
        where = f"world_size={self.world_size} backend={self.backend!r} launcher={self._launcher.describe()!r}"
        return f"<ppkit.Cluster {where} state={self.state!r} cpu_budget='{self.budget}' isolation='{self.isolation}'>"

    def _repr_html_(self) -> str:
        return diagnostics.cluster_html(self.world_size, self.backend, self.state, self.workers)


@atexit.register
def _close_all() -> None:
    # a child forked by the user (os.fork) runs this too: closing its copies would stop the owner's workers
    for cluster in [c for c in _live_clusters if c._pid == os.getpid()]:
        cluster.close()
