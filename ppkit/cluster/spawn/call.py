"""``ppkit.spawn``: ``torch.multiprocessing.spawn`` that runs functions defined in notebook cells.

Tutorials end with ``mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)``. In a
notebook mp.spawn cannot find a cell's function (its processes import ``__main__``, which is not
the notebook), and persistent workers cannot re-create the tutorial's process group on its fixed
port (PyTorch issue 74666). So ``spawn`` keeps a hidden ``Cluster(nprocs, process_group=False)``
per process count whose workers are started anew for every call and stopped when it ends: between
calls only its fork server stays, and a call costs a few forks rather than an ``import torch`` per
process.
"""

from __future__ import annotations

import ctypes
import inspect
import os
import threading
from collections import OrderedDict

from ppkit.cluster.controller import Cluster
from ppkit.cluster.debug import parked
from ppkit.cluster.spawn import explain
from ppkit.cluster.spawn.one_call import Call, time_limit
from ppkit.errors import ClusterStateError, ConfigError, JobInterrupted
from ppkit.transport.zygote import PRELOAD_ENV

PRELOAD = ("torch._dynamo",)  # DDP, FSDP and DTensor import it on first use: 1-2 s in each new process
START_METHODS = {"auto": "auto", "forkserver": "forkserver", "fork": "forkserver", "spawn": "spawn"}
KEEP = 2  # hidden clusters (fork servers) kept between calls, the most recently used ones
PRESTART_NPROCS = 2  # the fork server %load_ext ppkit starts ahead: the tutorials' world_size
PRESTART_ENV = "PPKIT_PRESTART"  # "0": %load_ext ppkit starts nothing ahead
_kept: OrderedDict[tuple, Cluster] = OrderedDict()  # (nprocs, start method) -> its hidden cluster
_environ: dict[tuple, dict] = {}  # the kernel's os.environ when that cluster's processes began
_running: set[tuple] = set()  # clusters running a join=False call
_starting = threading.RLock()  # held while a hidden cluster starts: a call or close() waits for prestart's
_closes = [0]  # close() calls so far: a prestart that had not begun when close() ran starts nothing
_waiting: dict[tuple, int] = {}  # calls waiting for _starting, by key: prestart hands them its new processes
_unused: set[tuple] = set()  # clusters whose processes, started by prestart, no call has used yet


def spawn(fn, args=(), nprocs: int = 1, join: bool = True, daemon: bool = False, start_method: str = "auto",
          *, timeout: float | None = None, profile=False):
    """Run ``fn(i, *args)`` in ``nprocs`` new processes, ``i`` = 0 .. nprocs-1, as mp.spawn does.

    >>> ppkit.spawn(demo_basic, args=(world_size,), nprocs=world_size)   # the DDP tutorial's run_demo

    ``fn`` may be defined in a notebook cell. Each call gets fresh processes (forked from a fork
    server that imported torch once; ``start_method="spawn"``: fresh interpreters), prints what
    each writes as ``[rank i] ...``, and stops them all when it returns. A failure in any process
    raises ``ProcessRaisedError`` or ``ProcessExitedError`` with its traceback and stops the others.
    There is no time limit unless ``timeout`` (seconds) is given: then ``JobTimeoutError`` says where
    each waited. Without one, a run that seems hung is shown once with where each process waits
    (hang_watch.py) and goes on; Kernel > Interrupt stops it. A process ends when ``fn`` returns, as
    under mp.spawn: its non-daemon threads are joined and its atexit handlers run; an exit with
    status 0 (``sys.exit(0)``, ``os._exit(0)``) is a success. ``join=False`` returns a
    ``SpawnContext`` at once. ``daemon`` is accepted and ignored: the processes never outlive the
    kernel. Returns None, as mp.spawn does (return values are dropped; use ``cluster.run`` for them).
    ``profile=True`` runs every process under torch.profiler and returns a ``ppkit.Profile``: one
    timeline of all of them (docs/profiling.md); ``profile=dict(record_shapes=False)`` leaves out input shapes.
    """
    args = _check(fn, args, nprocs, start_method)
    timeout = time_limit(timeout)
    profiling = _profile_request(profile)
    key = (nprocs, START_METHODS[start_method])
    if key in _running:
        raise ClusterStateError(
            f"a ppkit.spawn(..., nprocs={nprocs}, join=False) is still running. Call its join() first "
            "(context = ppkit.spawn(..., join=False); context.join()).")
    if profiling is not None and not join:
        raise ConfigError("profile=True needs join=True: the profile is what the call returns once every process "
                          "has finished. Leave join out, or profile a join=False run's function with torch.profiler.")
    call = Call(_processes(key, explain.SPAWN), fn, args, timeout, _environ[key])
    call.profile = profiling
    if join:
        return call.run()
    return SpawnContext(call, key)


def _profile_request(profile):
    from ppkit.profiling import collect

    return collect.request(profile)


class SpawnContext:
    """What ``ppkit.spawn(..., join=False)`` returns: the processes run while the cell goes on.

    ``join(timeout=None)`` is mp's ``ProcessContext.join``: True once every process has finished,
    False if ``timeout`` seconds pass first, and the call's error if one failed. ``pids()`` lists
    the processes' ids. Kernel > Interrupt during ``join()`` stops them.
    """

    def __init__(self, call: Call, key: tuple):
        self._call = call
        self._key = key
        self._error: BaseException | None = None
        # an Event, not Thread.join: a Ctrl-C that interrupts Thread.join marks a running thread
        # as stopped (CPython 3.11, bpo-45274's fix)
        self._done = threading.Event()
        _running.add(key)
        self._thread = threading.Thread(target=self._run, name="ppkit-spawn", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._call.run()
        except BaseException as exc:  # noqa: BLE001 - join() raises it in the caller's thread
            self._error = exc
        finally:
            _running.discard(self._key)
            self._done.set()

    def pids(self) -> list[int]:
        return [self._call.pids[rank] for rank in sorted(self._call.pids)]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """``grace_period`` is accepted for mp's signature: after one process fails, the others
        get a few seconds to finish anyway, then every one is stopped."""
        try:
            self._done.wait(timeout)
        except KeyboardInterrupt:
            if not self._done.is_set():  # the running call cancels, says where each was, stops all
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread.ident),
                                                           ctypes.py_object(KeyboardInterrupt))
            self._done.wait()
        if not self._done.is_set():
            return False
        if self._error is not None:
            raise self._error
        return True


def run_fresh(fn, args: tuple, nprocs: int, timeout: float | None, caller: explain.Caller,
              shown: tuple | None = None, output=None, profile=None, park: bool = True):
    """``fn(i, *args)`` on ``nprocs`` fresh forks of the fork server, as ``spawn(..., join=True)``
    runs it, its errors worded for ``caller`` (``%%torchrun`` runs its ranks with this). ``shown``:
    the learner's ``(fn, args)`` to name if something cannot be pickled, where ``fn`` wraps them.
    ``profile``: a profiling.collect.Request, and then the run's ``ppkit.Profile`` is returned.
    ``park`` False: no rank that raised stays for ``%debug`` (an attempt that will be restarted)."""
    __tracebackhide__ = True  # noqa: F841 - read by IPython's traceback
    key = (nprocs, "auto")  # the fork server that ppkit.spawn's default start method uses
    if key in _running:
        raise ClusterStateError(
            f"a ppkit.spawn(..., nprocs={nprocs}, join=False) is still running, on the processes {caller.name} "
            "needs. Call its join() first (context.join()).")
    call = Call(_processes(key, caller), fn, args, timeout, _environ[key], caller)
    call.shown, call.profile, call.park = shown or call.shown, profile, park
    if output is not None:  # ${hostname}: each rank's, as it said when it started
        output = output.on_hosts({rank: worker["host"] for rank, worker in call.cluster.workers.items()})
    with call.cluster.printing(output):
        return call.run()


def run_on(cluster: Cluster, fn, args: tuple, timeout: float | None, caller: explain.Caller,
           shown: tuple | None = None, output=None, profile=None):
    """``fn(i, *args)`` on the processes of ``cluster`` (``%%torchrun --nnodes``'s SLURM cluster), as
    ``run_fresh`` runs it on the fork server's, its processes stopped when it ends."""
    __tracebackhide__ = True  # noqa: F841
    call = Call(cluster, fn, args, timeout, dict(os.environ), caller)
    call.shown, call.park = shown or call.shown, False  # ranks on SLURM nodes are not kept for %debug
    call.profile = profile
    with cluster.printing(output):
        return call.run()


def prestart(nprocs: int = PRESTART_NPROCS) -> threading.Thread | None:
    """Start, in a background thread, the fork server that a first ``ppkit.spawn(..., nprocs=nprocs)``
    or ``%%torchrun --nproc-per-node nprocs`` uses (``%load_ext ppkit`` calls this), so that the call
    finds torch imported and costs a few forks. Quiet: if it fails, the first call starts it and says why.
    Other process counts start their own fork server on first use, as before."""
    key = (nprocs, "auto")
    if os.environ.get(PRESTART_ENV) == "0" or key in _kept:
        return None
    thread = threading.Thread(target=_prestart, args=(key, _closes[0]), name="ppkit-spawn-prestart", daemon=True)
    thread.start()
    return thread


def _prestart(key: tuple, closes: int) -> None:
    with _starting:
        if key in _kept or _closes[0] != closes:  # a call came first, or close() did
            return
        try:
            cluster = _start(key)
            if _waiting.get(key):  # a call is waiting: its processes are ready, stopping them would cost a start
                _unused.add(key)
            else:
                cluster.stop_workers("ppkit.spawn started its fork server ahead of the first call.")
        except Exception:  # noqa: BLE001 - the first call starts it again and reports what fails
            pass


def _processes(key: tuple, caller: explain.Caller) -> Cluster:
    """``_fresh_cluster(key)``; Kernel > Interrupt while the processes start says so, without ppkit's frames."""
    try:
        return _fresh_cluster(key)
    except KeyboardInterrupt:
        pass  # raised below, outside this block: the KeyboardInterrupt and its frames are not shown with it
    raise JobInterrupted(f"interrupted while the {key[0]} {caller.units} of this {caller.name} were starting: none "
                         f"of them ran {caller.work} yet. The next {caller.name} starts fresh ones.")


def _fresh_cluster(key: tuple) -> Cluster:
    """The hidden cluster for ``key``, with processes started for this call."""
    parked.release()  # a rank kept for %debug goes when the next call comes
    _waiting[key] = _waiting.get(key, 0) + 1
    try:
        _starting.acquire()
    finally:
        _waiting[key] -= 1
    try:
        cluster = _kept.get(key) if key in _unused else None
        _unused.discard(key)
        if cluster is not None and cluster.state != "closed":
            return cluster  # prestart's processes, started while this call waited
        return _start(key)
    finally:
        _starting.release()


def _start(key: tuple) -> Cluster:
    cluster = _kept.pop(key, None)
    if cluster is not None and cluster.state != "closed":
        _kept[key] = cluster
        cluster.restart()
        return cluster
    for old in [k for k in _kept if k not in _running][:max(0, len(_kept) - KEEP + 1)]:
        _unused.discard(old)
        _kept.pop(old).close()
    _environ[key] = dict(os.environ)
    os.environ[PRELOAD_ENV] = ",".join(PRELOAD)  # read by the fork server when it starts
    try:
        cluster = Cluster(key[0], "gloo", process_group=False, start_method=key[1])
    finally:
        os.environ.pop(PRELOAD_ENV, None)
    _kept[key] = cluster
    return cluster


def close() -> None:
    """Stop the fork servers that ppkit.spawn keeps between calls (the kernel's exit does too)."""
    _closes[0] += 1
    with _starting:  # one that prestart is starting, once started
        _close_kept()


def _close_kept() -> None:
    _unused.clear()
    while _kept:
        _kept.popitem()[1].close()


def _check(fn, args, nprocs, start_method) -> tuple:
    if not callable(fn):
        raise ConfigError(
            f"ppkit.spawn needs the function each process runs, fn(i, *args), got {type(fn).__name__} "
            f"{fn!r:.60}. Pass the function itself: ppkit.spawn(demo_basic, args=(world_size,), "
            "nprocs=world_size), not demo_basic(...).")
    if not isinstance(args, (tuple, list)):
        raise ConfigError(
            f"args must be a tuple of the arguments after i, got {type(args).__name__} {args!r:.60}. "
            "Write args=(world_size,): with the comma; (world_size) is just a number.")
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ConfigError(f"nprocs must be a whole number of processes, at least 1, got {nprocs!r}: "
                          "ppkit.spawn(fn, args=(world_size,), nprocs=world_size).")
    if start_method not in START_METHODS:
        raise ConfigError(
            f"unknown start_method {start_method!r}; the choices are {', '.join(map(repr, START_METHODS))}. "
            "'auto' (the default) and 'fork'/'forkserver' fork each process from ppkit's fork server; "
            "'spawn' starts each as a fresh interpreter (as mp.spawn's default does, seconds per process).")
    try:
        inspect.signature(fn).bind(0, *args)
    except TypeError as exc:
        name = getattr(fn, "__name__", "fn")
        raise ConfigError(
            f"{name} cannot be called as {name}(i, *args) with args={tuple(args)!r}: {exc}. mp.spawn and "
            f"ppkit.spawn pass the process index first: def {name}(rank, ...).") from None
    except ValueError:  # a builtin without a signature to read: the call decides
        pass
    return tuple(args)
