"""The worker process: joins a controller, becomes one rank, and runs the jobs it is sent.

A worker has two threads that matter: the main thread runs jobs one at a time (``fn(rank, world_size, *args)``);
the reader thread answers the controller at once, even while a job blocks in C++: ``stacks`` (where is the main
thread waiting?), ``cancel`` and ``shutdown``. If the controller goes away the reader sees EOF and the worker
exits, so a killed kernel leaves no worker behind. Everything the rank writes to file descriptors 1 and 2
(Python prints and C++ logs alike) is captured through pipes (capture.py) and sent to the controller, which
prints it with a rank prefix; its metrics too (metrics.py).
"""

from __future__ import annotations

import ctypes
import linecache
import os
import queue
import signal
import socket
import sys
import threading
from datetime import timedelta

from ppkit.transport import (
    byvalue,
    channel,
    flight_record,
    interpreter_exit,
    metrics,
    procs,
    rendezvous,
    shown_traceback,
)
from ppkit.transport.capture import OutputPipe
from ppkit.transport.debug.messages import DebugLine, PostMortem
from ppkit.transport.debug.rank_pdb import RankDebugger, drop_async_exc
from ppkit.transport.flight_messages import AskFlightRecord, FlightRecord
from ppkit.transport.messages import (
    AskStacks,
    Cancel,
    Cancelled,
    ErrorInfo,
    FileStoreAt,
    Hello,
    Init,
    JoinConfig,
    JoinFailed,
    Ready,
    Reject,
    Result,
    Run,
    Shutdown,
    Stacks,
    WorkerHello,
    WorkerInfo,
)
from ppkit.transport.versions import ppkit_version, torch_version, versions  # noqa: F401 - named here too

NAMESPACE: dict = {}  # persistent globals of %%ranks cells on this worker
_exit = os._exit  # the worker's own; a job's os._exit first sends what the rank printed (_exit_after_output)


class _Cancelled(BaseException):
    """Raised asynchronously in the main thread when the controller cancels the job."""


class Worker:
    def __init__(self, conn, hello: WorkerHello):
        self.conn = conn
        self._send_lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._current = None
        self._current_lock = threading.Lock()  # guards the three below
        self._started = 0  # the last job id the main thread took (ids only grow)
        self._cancelled: set[int] = set()  # jobs cancelled before the main thread took them
        self._main_ident = threading.get_ident()
        self.send(Hello(hello))
        msg = conn.recv()
        if isinstance(msg, Reject):
            print(f"ppkit worker: the controller refused this worker: {msg.reason}", file=sys.stderr)
            sys.exit(2)
        if not isinstance(msg, Init):
            raise RuntimeError(f"ppkit worker: expected Init from the controller, got {msg!r:.80}")
        self.config: JoinConfig = msg.config
        self.rank: int = self.config.rank
        self.world_size: int = self.config.world_size

    def send(self, msg, wait: float = -1) -> None:
        if self._send_lock.acquire(timeout=wait):  # past wait s (-1: none), msg is dropped: last words, in a handler
            try:
                self.conn.send(msg)
            except OSError:
                _exit(1)
            finally:
                self._send_lock.release()

    # -- set-up -------------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.config
        if threading.current_thread() is threading.main_thread():  # torchrun's workers have Python's default
            # handler; a fork server started while ipykernel ignored SIGINT (between cells) passed SIG_IGN on
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if cfg.capture_output:
            sys.stdout.flush()
            sys.stderr.flush()
            self._pipes = [OutputPipe(1, "stdout", self.send), OutputPipe(2, "stderr", self.send)]
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
            os._exit = self._exit_after_output
        else:
            self._pipes = []
        metrics.attach(self.send)  # ppkit.log_metrics on this rank: to the kernel's live plot
        os.environ.update(cfg.env)
        if cfg.threads:
            set_torch_threads(cfg.threads)
        if cfg.cwd and os.path.isdir(cfg.cwd):
            os.chdir(cfg.cwd)
        for path in reversed(cfg.sys_path):
            if path not in sys.path:
                sys.path.insert(0, path)
        self.debugger = RankDebugger(self.rank, self.send, self._sync_output)
        self.debugger.install()  # breakpoint() on this rank asks the notebook (debug/rank_pdb.py)
        threading.Thread(target=self._read_loop, name="ppkit-reader", daemon=True).start()
        flight_record.install(self._last_words)  # the p2p ring, and the last words as gloo aborts the process
        rendezvous.watch()  # init_process_group in a job: remembered, its store kept on loopback
        info = WorkerInfo(rank=self.rank, pid=os.getpid(), host=socket.gethostname(), backend=cfg.backend,
                          device=cfg.device)
        try:
            self._init_process_group()
        except BaseException as exc:
            self._sync_output()
            self.send(JoinFailed(_error_info(exc)))
            raise SystemExit(1)
        NAMESPACE.update(rank=self.rank, world_size=self.world_size)
        self._sync_output()
        self.send(Ready(info))

    def _init_process_group(self) -> None:
        cfg = self.config
        if cfg.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(cfg.device))
        if not cfg.process_group:
            return
        import torch.distributed as dist

        dist.set_debug_level_from_env()  # torch read TORCH_DISTRIBUTED_DEBUG in the fork server, before env=
        if cfg.store is None:
            raise RuntimeError(f"ppkit worker: rank {self.rank} is to join a process group, but the controller "
                               "named no store for its rendezvous (a launcher's init_config sets one)")
        if isinstance(cfg.store, FileStoreAt):
            store = dist.FileStore(cfg.store.path, self.world_size)
        else:
            store = dist.TCPStore(cfg.store.host, cfg.store.port, self.world_size, is_master=False,
                                  timeout=timedelta(seconds=cfg.join_timeout))
        dist.init_process_group(cfg.backend, store=store, rank=self.rank,
                                world_size=self.world_size,
                                timeout=timedelta(seconds=cfg.pg_timeout))
        import torch

        NAMESPACE.update(torch=torch, dist=dist)

    def _exit_after_output(self, code: int) -> None:
        """``os._exit`` in a job (a script's last line, a library's abort): first what is in the pipes, then
        its final record (the collectives it made, for the doctor once it is gone)."""
        try:
            self._sync_output()
            job = self._current
            if job is not None:  # in a job (after one, serve has sent the final record)
                self.send(FlightRecord(job, flight_record.snapshot(sys._getframe(1)), last_words=True), wait=1)
        finally:
            _exit(code)

    def _sync_output(self) -> None:
        metrics.flush()  # a job's last metrics, before its answer
        sys.stdout.flush()
        sys.stderr.flush()
        for pipe in self._pipes:
            pipe.sync()

    # -- the reader thread ----------------------------------------------------------------
    def _read_loop(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                _exit(1)  # the controller is gone: so are we
            if isinstance(msg, Run):
                self._jobs.put(msg)
            elif isinstance(msg, AskStacks):
                frame = sys._current_frames().get(self._main_ident)
                text = shown_traceback.stack_text(frame) if frame else "(no Python frame)"
                text = interpreter_exit.waiting_for() or text  # fn returned: the threads the exit waits for
                self.send(Stacks(self._current, text, rendezvous.history()))
            elif isinstance(msg, AskFlightRecord):  # answered here, while the main thread waits in a collective
                self.send(self._flight_record())
            elif isinstance(msg, Cancel):
                with self._current_lock:
                    if self._current == msg.job_id:
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(
                            ctypes.c_ulong(self._main_ident), ctypes.py_object(_Cancelled))
                    elif msg.job_id > self._started:  # queued, not started: it never will be
                        self._cancelled.add(msg.job_id)
            elif isinstance(msg, DebugLine):
                self.debugger.reply(msg.line)
            elif isinstance(msg, PostMortem):
                self.debugger.post_mortem()
            elif isinstance(msg, Shutdown):
                try:
                    self._sync_output()
                except Exception:
                    pass
                _exit(0)

    def _last_words(self) -> None:
        """As the process aborts (flight_record.on_abort's handler): what it wrote last, then its record. The
        C++ runtime printed the reason before abort() (gloo's "Is there a distributed collective mismatch in
        your code?"), and the pump threads must send it before the process ends. No Python-level flush: the
        interrupted thread may hold a stream's lock."""
        for pipe in reversed(self._pipes):  # stderr first
            pipe.sync(timeout=flight_record.HANDLER_S / 4)
        self.send(self._flight_record(last_words=True), wait=1)

    def _flight_record(self, last_words: bool = False) -> FlightRecord:
        frame = sys._current_frames().get(self._main_ident)
        return FlightRecord(self._current, flight_record.snapshot(frame, self._current is not None, self._main_ident),
                            last_words)

    # -- the main thread --------------------------------------------------------------------
    def serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                reply = self._begin(job) or self._run_job(job.job_id, job.payload)
            except _Cancelled:  # a cancel that landed as the job ended, past its own handlers
                reply = Cancelled(job.job_id)
            while True:  # a cancel may still land inside _leave; after it none can
                try:
                    self._leave()
                    break
                except _Cancelled:
                    continue
            if ends := job.last and isinstance(reply, Result) and reply.ok:  # the process ends as a script does
                interpreter_exit.run_exit_functions()
            self._sync_output()
            if ends:  # its final record: once it is gone, the doctor still knows which collectives it made
                self.send(FlightRecord(job.job_id, flight_record.snapshot(None), last_words=True))
            self.send(reply)
            if ends:
                raise SystemExit(0)

    def _begin(self, job: Run) -> Cancelled | None:
        """Make ``job`` the current one; its reply at once if it was cancelled while queued."""
        for cell in job.sources:  # notebook cells, for tracebacks and stacks (IPython's linecache entries)
            linecache.cache[cell.filename] = (len(cell.text), None, cell.text.splitlines(True), cell.filename)
        with self._current_lock:
            self._started = job.job_id
            if job.job_id in self._cancelled:
                self._cancelled = {j for j in self._cancelled if j > job.job_id}
                return Cancelled(job.job_id)
            self._current = job.job_id
        metrics.start_job(job.job_id)  # its ppkit.log_metrics values: this job's plot only
        return None

    def _leave(self) -> None:
        """No job is current: from now on no cancel is raised in the main thread, and one raised
        but not delivered yet is dropped."""
        self.debugger.end_job()  # no more pdb sessions; untraced, if one stepped out of the job
        with self._current_lock:
            self._current = None
            drop_async_exc(self._main_ident)  # not SetAsyncExc(NULL): see debug/rank_pdb.py

    def _run_job(self, job_id, payload):
        self.debugger.start_job()
        try:
            fn, args, kwargs = byvalue.loads(payload)
            value = fn(self.rank, self.world_size, *args, **kwargs)
            self._leave()  # the job is done: pickling its result is not cancelled
        except _Cancelled:
            return Cancelled(job_id)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
            self._leave()
            self.debugger.kept = exc  # for a post-mortem (cluster.debug())
            return Result(job_id, False, _error_info(exc, skip=1, rendezvous=rendezvous.history()))
        try:
            return Result(job_id, True, byvalue.dumps(value))
        except Exception as exc:
            return Result(job_id, False, _error_info(exc, note=(
                f"the job finished but its return value ({type(value).__name__}) cannot be "
                "pickled to send back to the notebook. Return plain data or tensors instead.")))


def set_torch_threads(threads: int) -> None:
    """This worker's share of the learner's CPU budget (ppkit/cluster/budget.py), intra- and inter-op."""
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)  # possible once, before any inter-op work: a new worker
    except RuntimeError:
        pass


def _error_info(exc: BaseException, skip: int = 0, note: str | None = None, rendezvous=()) -> ErrorInfo:
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = shown_traceback.exception_text(exc, tb)
    return ErrorInfo(type(exc).__name__, note or str(exc), text, tuple(rendezvous))


def exec_cell(rank: int, world_size: int, source: str, cell_id: str):
    """Run a %%ranks cell's source on this rank, in the worker's persistent namespace."""
    filename = f"<%%ranks cell {cell_id}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    NAMESPACE.update(rank=rank, world_size=world_size)
    NAMESPACE.setdefault("__name__", "__ppkit_ranks__")
    exec(compile(source, filename, "exec"), NAMESPACE)


def run(address: tuple[str, int], key: bytes, rank: int | None = None, name: str | None = None) -> None:
    """Connect to the controller at ``address`` and serve jobs until told to stop."""
    procs.volunteer_for_oom_kill()  # out of memory: a worker goes before the kernel and the fork server
    conn = channel.connect(address, key)
    worker = Worker(conn, WorkerHello(rank, name, os.getpid(), socket.gethostname(), versions()))
    worker.setup()
    worker.serve()
