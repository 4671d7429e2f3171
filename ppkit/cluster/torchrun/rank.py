"""What each ``%%torchrun`` process runs: the environment, folder, ``sys.argv`` and ``sys.path`` of a
torchrun worker, then the script as ``__main__`` (or a cell's function).

The frames of ``run_as_rank`` and ``_run_target`` are left out of tracebacks (spawn/explain.py), so
that a learner's traceback starts at the cell's own line.
"""

from __future__ import annotations

import builtins
import errno
import linecache
import os
import runpy
import sys
import types
from dataclasses import dataclass

from ppkit.cluster import worker_setup
from ppkit.cluster.torchrun.environ import rank_env
from ppkit.errors import ConfigError

STORE_TIMEOUT_S = 300.0  # what a rank's store request may wait; the run's own timeout stops a hang first
_store = None  # rank 0's store, kept for the life of the process as torchrun's agent keeps its own


@dataclass(frozen=True)
class Script:
    """A script's text, run as ``__main__``: a cell's (``filename`` like ``<%%torchrun cell 3>``,
    shown in tracebacks through linecache) or a file's (read by the kernel, its path as filename)."""

    source: str
    filename: str
    argv0: str

    def module(self):
        """The compiled code and a fresh ``__main__`` module to run it in."""
        if self.filename.startswith("<"):
            linecache.cache[self.filename] = (len(self.source), None, self.source.splitlines(True), self.filename)
        module = types.ModuleType("__main__")
        module.__dict__.update(__file__=self.argv0, __builtins__=builtins)
        return compile(self.source, self.filename, "exec"), module


@dataclass(frozen=True)
class Module:
    """``torchrun -m name``: the module run as ``python -m name`` runs it (runpy), found from the
    notebook's folder; ``argv0`` is its name until runpy puts its file's path in ``sys.argv[0]``."""

    name: str

    @property
    def argv0(self) -> str:
        return self.name


@dataclass(frozen=True)
class Call:
    """``fn(*args, **kwargs)``: ppkit.torchrun's function, taking no rank."""

    fn: object
    args: tuple
    kwargs: dict


def run_as_rank(rank: int, env: dict, cwd: str, path0: str, argv: list, target, own: dict | None = None) -> None:
    """Called as ``fn(i, *args)`` by ppkit.spawn's machinery, in a fresh fork of the fork server (or
    on a SLURM node, nodes.py). ``own``: each rank's own variables, where it is not the only node."""
    global _store
    os.environ.update(env)
    os.environ.update(rank_env(rank) if own is None else own[rank])
    _threads_as_at_import(os.environ.get("OMP_NUM_THREADS", ""))
    if rank == 0 and _store is None:  # a run on several nodes hosts it first, to learn its port (nodes.py)
        _store = host_store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]))
    os.chdir(cwd)
    sys.path.insert(0, path0)  # a script's folder, or the notebook's, comes first as under python
    sys.argv = list(argv)
    _run_target(target)


def _threads_as_at_import(value: str) -> None:
    """torch reads OMP_NUM_THREADS when it is imported, and the fork server imported it before: set
    what a fresh interpreter under torchrun would have (1 thread per process by default)."""
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))


def host_store(host: str, port: int, world_size: int):
    """The rendezvous store that torchrun's agent would host, on ``host`` only, before the script
    starts: every rank's ``init_process_group`` joins it as a client (TORCHELASTIC_USE_AGENT_STORE),
    so none of them races rank 0 to a port that is not listening yet and backs off."""
    try:
        return worker_setup.tcp_store(host, world_size, STORE_TIMEOUT_S, port=port, multi_tenant=True)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            hint = ("Another program (or a run that is still going) holds that port. Leave --master-port out, "
                    "so that a free port is picked for each run, or give another one.")
        else:
            hint = ("All ranks run on this machine: leave --master-addr out (127.0.0.1), or name an address "
                    "of this machine.")
        raise ConfigError(f"rank 0 cannot host the rendezvous store on {host}:{port}: {exc.strerror}. {hint}") from None


def host_store_first(host: str, port: int, world_size: int) -> int:
    """On several nodes, rank 0 hosts the store before the others learn where (nodes.py): its port,
    a free one where ``port`` is 0. ``run_as_rank`` then keeps it."""
    global _store
    _store = worker_setup.tcp_store(host, world_size, STORE_TIMEOUT_S, port=port, multi_tenant=True)
    return _store.port


def _run_target(target) -> None:
    try:
        if isinstance(target, Call):
            target.fn(*target.args, **target.kwargs)
            return
        if isinstance(target, Module):
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            return
        code, module = target.module()
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = module  # pickle and dataclasses find the script's classes, as under torchrun
        try:
            exec(code, module.__dict__)
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
    except SystemExit as exc:  # sys.exit(0) or exit() at the end of a script is a success, as under torchrun
        if exc.code not in (None, 0):
            raise
