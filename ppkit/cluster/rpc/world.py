"""An RPC world whose rank 0 is the notebook kernel itself, as in the RPC tutorial.

``ppkit.start_rpc(2)`` makes this process the RPC "master" and starts "worker1", "worker2" as
background workers, so notebook cells call ``torch.distributed.rpc`` directly.

Three things this module takes care of, because learners hit them at once:
- RPC can be initialised once per process at a time: starting a new world shuts the old one down
  first, and ``close()`` never hangs, even after a failed or timed-out RPC.
- Every process uses TensorPipe's ``uv`` transport only. With the default transports each idle
  process busy-polls a full core (the shared-memory reactor); the option only works when given
  at construction.
- RPC pickles functions and classes *by reference* (module + name), so one defined in a notebook
  cell cannot be found on a worker. While the world runs, every process sends them by value
  instead (``ppkit/cluster/rpc/pickler.py``), so the tutorial's code runs as written.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings

from ppkit import compat
from ppkit.checks import check_keywords
from ppkit.cluster import worker_setup
from ppkit.cluster.admission import without_socket_vars
from ppkit.cluster.controller import Cluster
from ppkit.cluster.isolation import rpc_isolation
from ppkit.cluster.rpc import pickler as rpc_pickle
from ppkit.cluster.rpc.options import check_rpc
from ppkit.compat import require_rpc_internals
from ppkit.errors import ClusterStateError, ConfigError, LaunchError
from ppkit.transport import byvalue, procs

MASTER = "master"
_active: RpcWorld | None = None
_kernel_rpc_stuck = False  # set if a shutdown never returned: RPC cannot start again here
# torch creates its RRef context once per process, around the first RPC agent, and keeps using
# that agent's worker table: ``rref.owner()`` (and so every ``rref.rpc_sync()`` helper) fails with
# "could not find destination id N" for a rank the first world did not have.
_first_world_workers: int | None = None


def _loads(data: bytes):
    return byvalue.loads(data)


class _ByValue:
    def __init__(self, obj):
        self.obj = obj
        self.__name__ = getattr(obj, "__name__", type(obj).__name__)
        self.__qualname__ = getattr(obj, "__qualname__", self.__name__)
        self.__doc__ = getattr(obj, "__doc__", None)

    def __call__(self, *args, **kwargs):
        return self.obj(*args, **kwargs)

    def __reduce__(self):
        # Unpickles to the bare function or class on the other side.
        return (_loads, (byvalue.dumps(self.obj),))

    def __repr__(self) -> str:
        return f"ppkit.by_value({self.obj!r})"


def by_value(obj):
    """Wrap a function or class so RPC sends it by value. No longer needed in a ppkit RPC world.

    ``ppkit.start_rpc`` makes every process send what a notebook cell defines by value by itself,
    so ``rpc.rpc_sync("worker1", square, args=(3,))`` works as written. The wrapper still works
    (notebooks written for earlier ppkit versions use it):

    >>> def square(x):
    ...     return x * x
    >>> rpc.rpc_sync("worker1", ppkit.by_value(square), args=(3,))
    9
    """
    if not callable(obj):
        raise ConfigError(f"by_value() wraps a function or class, got {type(obj).__name__}.")
    return _ByValue(obj)


def backend_options(num_worker_threads: int, rpc_timeout: float, init_method: str):
    from torch.distributed import rpc

    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout,
        init_method=init_method, _transports=["uv"])


def _init_rpc(name: str, rank: int, world_size: int, options: dict, env: dict,
              init_counter: int | None = None) -> str:
    from torch.distributed import rpc

    os.environ.update(env)
    rpc_pickle.install()  # before the agent exists: cell-defined code travels by value
    compat.align_rpc_state(init_counter)  # the kernel's count of init_rpc calls, and no stale all_gather
    with warnings.catch_warnings():
        # init_rpc trips torch's own "ProcessGroupGloo as a ProcessGroup" deprecation warning
        warnings.filterwarnings("ignore", message="You are using a Backend")
        rpc.init_rpc(name, rank=rank, world_size=world_size,
                     rpc_backend_options=backend_options(**options))
    return name


def _worker_init(rank: int, world_size: int, rpc_world_size: int, options: dict, env: dict,
                 init_counter: int) -> str:
    return _init_rpc(f"worker{rank + 1}", rank + 1, rpc_world_size, options, env, init_counter)


class RpcWorld:
    """This process as RPC rank 0 ("master") plus ``num_workers`` background workers."""

    def __init__(self, num_workers: int = 2, *, num_worker_threads: int = 16,
                 rpc_timeout: float = 60.0, start_timeout: float = 120.0,
                 env: dict[str, str] | None = None, listen: str | None = None, remote=None,
                 key: bytes | str | None = None, start_method: str = "auto", launcher: str | None = None,
                 nodes: int | None = None, partition: str | None = None, time: str | None = None,
                 sbatch_args=()):
        spec = check_rpc(num_workers, num_worker_threads=num_worker_threads, rpc_timeout=rpc_timeout, env=env,
                         start_timeout=start_timeout, listen=listen, remote=remote, key=key,
                         start_method=start_method, launcher=launcher, nodes=nodes, partition=partition,
                         time=time, sbatch_args=sbatch_args)
        self.rpc_timeout, self.start_timeout = float(rpc_timeout), float(start_timeout)  # checked above
        _check_kernel_free(num_workers)
        self.num_workers, self.num_worker_threads = num_workers, num_worker_threads
        self.worker_names = list(spec.labels)
        self.names = [MASTER, *self.worker_names]
        self._env = {**worker_setup.local_env(), **(env or {})}
        self._worker_env = self._env
        self.cluster = Cluster.from_spec(spec)
        self.isolation = rpc_isolation()  # the kernel is rank 0: no private network (isolation.py)
        if spec.launcher in ("remote", "slurm"):  # this process binds to its address; each worker to its own
            self._env = {**self.cluster.local_env(), **(env or {})}
            self._worker_env = without_socket_vars(env or {})
        self.state = "starting"
        self._generation, self._cleanups = 0, {}  # cleanups: fn -> None, run at restart/close
        try:
            self._init()
        except BaseException:
            self.close()
            raise

    def _init(self) -> None:
        init_method = self.cluster.rendezvous_url(f"rpc-store-{self._generation}-{time.monotonic_ns()}")
        options = {"num_worker_threads": self.num_worker_threads, "rpc_timeout": self.rpc_timeout,
                   "init_method": init_method}
        world_size = self.num_workers + 1
        kernel_error: list = []
        init_counter = compat.rpc_init_count()

        def init_kernel():
            try:
                _init_rpc(MASTER, 0, world_size, options, self._env)
            except BaseException as exc:  # noqa: BLE001
                kernel_error.append(exc)

        thread = threading.Thread(target=init_kernel, daemon=True, name="ppkit-rpc-init")
        thread.start()
        self.cluster.run(_worker_init, world_size, options, self._worker_env, init_counter,
                         timeout=self.start_timeout)
        thread.join(self.start_timeout)
        if thread.is_alive() or kernel_error:
            cause = kernel_error[0] if kernel_error else None
            raise LaunchError(
                "the notebook kernel could not join the RPC world as 'master'"
                + (f": {cause}" if cause else f" within {self.start_timeout:g} s")
                + ". Restart the kernel if this repeats.") from cause
        global _first_world_workers
        if _first_world_workers is None:
            _first_world_workers = self.num_workers
        self.state = "ready"

    def add_cleanup(self, fn) -> None:  # fn() runs once at the next restart or close
        self._cleanups[fn] = None

    def restart(self) -> RpcWorld:
        """Shut RPC down everywhere, restart the workers and form a fresh RPC world."""
        if self.state == "closed":
            raise ClusterStateError("this RPC world is closed; start a new one with ppkit.start_rpc().")
        self._shutdown_rpc()
        self.cluster.restart()
        self._generation += 1
        self._init()
        return self

    def _shutdown_rpc(self) -> None:
        """Stop RPC everywhere without ever blocking the kernel.

        A graceful ``rpc.shutdown()`` is a barrier over every rank: it hangs for good after a
        timed-out RPC, and in torch 2.14 a kernel's *second* graceful shutdown hangs in the
        agent's join even when all is well. The workers are about to be killed anyway, so:
        kill them first, then drop the kernel's agent with ``graceful=False``.
        """
        global _kernel_rpc_stuck
        from torch.distributed import rpc

        while self._cleanups:  # e.g. give the kernel back the threads and cores it had
            with contextlib.suppress(Exception):
                self._cleanups.popitem()[0]()
        if self.state not in ("ready", "broken"):
            return
        self.state = "stopping"
        # Our agent first, so the kernel does not log an "EOF" per worker it loses; TensorPipe
        # still logs "pipe closed" from C++ for each, which would look like an error in the
        # notebook, so fd 2 is muted meanwhile.
        with procs.muted_stderr():
            finished, _ = procs.run_with_deadline(lambda: rpc.shutdown(graceful=False), 10)
            self.cluster.stop_workers("its RPC world was shut down.")
            time.sleep(0.1)  # TensorPipe logs from its own threads
        if finished:
            rpc_pickle.uninstall()
        if not finished:
            _kernel_rpc_stuck = True

    def close(self) -> None:
        """Shut RPC down on every rank and stop the workers. Never hangs; safe to call twice."""
        global _active
        if self.state == "closed":
            return
        try:
            self._shutdown_rpc()
        finally:
            self.state = "closed"
            self.cluster.close()
            if _active is self:
                _active = None

    def mark_broken(self) -> None:
        """Tell the world an RPC failed, so ``close``/``restart`` skip the graceful shutdown."""
        if self.state == "ready":
            self.state = "broken"

    def __enter__(self) -> RpcWorld:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.mark_broken()
        self.close()

    def __repr__(self) -> str:
        return f"<ppkit.RpcWorld names={self.names} state={self.state!r}>"


def _check_kernel_free(num_workers: int, replacing: bool = False) -> None:
    """Refuse a world this kernel cannot host (``replacing``: ours runs, about to be closed)."""
    if _first_world_workers is not None and num_workers > _first_world_workers:
        raise ClusterStateError(
            f"this kernel's first RPC world had {_first_world_workers} worker(s), and torch keeps "
            "that world's table of workers for RRefs for the life of the process, so RRefs owned "
            f"by worker{_first_world_workers + 1} or later would fail ('could not find destination "
            f"id'). Use at most {_first_world_workers} worker(s) here, or restart the kernel "
            f"(Kernel > Restart) and start with ppkit.start_rpc({num_workers}) first.")

    if _kernel_rpc_stuck:
        raise ClusterStateError(
            "an earlier RPC shutdown in this kernel never returned, so RPC cannot start again in "
            "this process. Restart the kernel (Kernel > Restart), then run the cell again.")
    if not replacing and compat.rpc_agent_running():
        raise ClusterStateError(
            "RPC is already running in this kernel (rpc.init_rpc was called outside ppkit). "
            "Call rpc.shutdown() first, or restart the kernel.")


def start_rpc(num_workers: int = 2, **options) -> RpcWorld:
    """Make this kernel the RPC "master" (rank 0) with workers "worker1".."workerN".

    Re-running replaces the previous world. Options: ``num_worker_threads`` (16),
    ``rpc_timeout`` (60 s), ``start_timeout``; ``listen="ADDR:PORT"`` (with ``remote``, ``key``)
    to have the workers join from other machines (``ppkit worker``).
    """
    global _active
    require_rpc_internals()  # and RPC itself (not on Windows): the error names the lessons
    rpc_pickle.require_torch_internals()
    check_keywords(RpcWorld, "ppkit.start_rpc()", (num_workers,), options)  # all checks before closing it
    check_rpc(num_workers, **options)  # (RpcWorld checks them again: cheap, and nothing has started)
    _check_kernel_free(num_workers, replacing=_active is not None and _active.state != "closed")
    if _active is not None:
        _active.close()
    _active = RpcWorld(num_workers, **options)
    return _active


def active() -> RpcWorld | None:
    return _active
