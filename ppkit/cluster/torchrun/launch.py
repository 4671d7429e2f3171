"""Start a torchrun-style run on fresh forks of ppkit.spawn's fork server, and ``ppkit.torchrun``."""

from __future__ import annotations

import inspect
import os

from ppkit.cluster.output import OutputSettings
from ppkit.cluster.spawn import call as spawn_call
from ppkit.cluster.spawn.explain import Caller
from ppkit.cluster.torchrun import environ, nodes, options, restarts
from ppkit.cluster.torchrun.options import Launch, new_run_id
from ppkit.cluster.torchrun.rank import Call, Module, Script, run_as_rank
from ppkit.cluster.worker_setup import free_port
from ppkit.errors import ConfigError

CELL_MAGIC = Caller("%%torchrun", "rank", "Write %%torchrun --timeout SECONDS ...", "the script", "torchrun")
LINE_MAGIC = Caller("%torchrun", "rank", "Write %torchrun --timeout SECONDS ...", "the script", "torchrun")
FUNCTION = Caller("ppkit.torchrun", "rank", "Pass ppkit.torchrun(..., timeout=SECONDS)", "fn", "torchrun")


def torchrun(fn, args=(), kwargs=None, nproc_per_node: int = 1, *, nnodes: int = 1,
             timeout: float | None = None, master_port: int | None = None, collapse: bool = True, profile=False,
             max_restarts: int = 0):
    """Run ``fn(*args, **kwargs)`` in ``nproc_per_node`` fresh processes, each with the environment
    torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...).

    >>> def main():                          # a torchrun script's main(), defined in a cell
    ...     dist.init_process_group("gloo")  # no rank arguments: they come from the environment
    ...     ...
    >>> ppkit.torchrun(main, nproc_per_node=2)

    ``fn`` takes no rank (read it from ``os.environ["RANK"]`` or ``dist.get_rank()``). Output appears
    as ``[rank i] ...``; a failure raises ``ProcessRaisedError`` naming the rank and stops the others.
    No time limit unless ``timeout`` (seconds): then ``JobTimeoutError`` says where each rank waited.
    ``master_port``: None picks a free port for each run, as torchrun does without ``--master-port``. ``nnodes`` above 1
    runs ``nproc_per_node`` processes on each of that many SLURM nodes, in a SLURM job of their own
    (a step of the allocation inside one), as ``torchrun --nnodes`` would. ``collapse``: lines of
    several ranks that are the same or differ only in their numbers shown once, ``[ranks 0-3] loss 2.31…2.35
    (rank 2: 2.91)`` (docs/torchrun.md); False shows every line of every rank. Returns None;
    with ``profile=True`` every rank runs under torch.profiler and a ``ppkit.Profile`` is returned
    (``profile=dict(record_shapes=False)`` leaves out input shapes; docs/profiling.md). ``max_restarts``:
    when a rank fails, every rank stops and all start again, up to that many times, as ``torchrun
    --max-restarts`` (TORCHELASTIC_RESTART_COUNT says which attempt; docs/faults.md).
    """
    from ppkit.profiling import collect

    if not callable(fn):
        raise ConfigError(f"ppkit.torchrun needs the function each rank runs, got {type(fn).__name__} {fn!r:.60}. "
                          "Pass the function itself: ppkit.torchrun(main, nproc_per_node=2), not main().")
    args, kwargs = tuple(args), dict(kwargs or {})
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__name__", "fn")
        raise ConfigError(f"{name} cannot be called as {name}(*args, **kwargs) with args={args!r}, kwargs={kwargs!r}: "
                          f"{exc}. ppkit.torchrun passes no rank: each rank reads RANK from its environment "
                          "(or dist.get_rank()).") from None
    except ValueError:  # a builtin without a signature to read: the call decides
        pass
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ConfigError(f"nproc_per_node must be a whole number of processes, at least 1, got {nproc_per_node!r}: "
                          "ppkit.torchrun(main, nproc_per_node=2).")
    if master_port is not None and (isinstance(master_port, bool) or not isinstance(master_port, int)
                                    or not 0 < master_port < 65536):
        raise ConfigError(f"master_port must be a TCP port, 1 to 65535, or None for a free one; got {master_port!r}: "
                          "ppkit.torchrun(main, nproc_per_node=2, master_port=29500).")
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ConfigError(f"nnodes must be a whole number of nodes, at least 1, got {nnodes!r}: "
                          "ppkit.torchrun(main, nproc_per_node=2, nnodes=2) runs 2 processes on each of 2 SLURM nodes.")
    restarts_allowed = options.max_restarts(max_restarts, nnodes, "max_restarts=")
    __tracebackhide__ = True  # noqa: F841
    launch = Launch(nproc_per_node, "127.0.0.1", master_port, new_run_id(), "default", spawn_call.time_limit(timeout),
                    getattr(fn, "__name__", "fn"), (), nnodes,
                    output=OutputSettings(collapse=bool(collapse), live=True), profile=collect.request(profile),
                    max_restarts=restarts_allowed)
    return run(launch, Call(fn, args, kwargs), FUNCTION)


def run_cell(launch: Launch, source: str, cell_id: str):
    """A cell's text as the ``__main__`` script; its folder is the notebook's (the kernel's cwd)."""
    __tracebackhide__ = True  # noqa: F841 - read by IPython's traceback
    filename = f"<%%torchrun cell {cell_id}>"
    return run(launch, Script(source, filename, os.path.join(os.getcwd(), filename)), CELL_MAGIC)


def run_file(launch: Launch):
    """A script file, as ``torchrun [options] script.py [args]`` runs it; a module with ``-m``."""
    __tracebackhide__ = True  # noqa: F841
    if launch.module:
        return run(launch, Module(launch.script), LINE_MAGIC)
    path = os.path.abspath(launch.script)
    try:
        with open(path, encoding="utf-8") as file:
            source = file.read()
    except OSError as exc:
        raise ConfigError(f"%torchrun cannot read the script {launch.script!r} ({exc.strerror}); it looks in the "
                          f"notebook's folder, {os.getcwd()}. Give the script's path from there.") from None
    return run(launch, Script(source, path, launch.script), LINE_MAGIC)


def run(launch: Launch, target, caller: Caller):
    """The run on its ranks: None, or its ``ppkit.Profile`` where ``launch.profile`` asks for one."""
    __tracebackhide__ = True  # noqa: F841
    cwd = os.getcwd()
    path0 = os.path.dirname(os.path.abspath(target.argv0)) if isinstance(target, Script) else cwd  # -m: cwd
    argv = [target.argv0 if isinstance(target, (Script, Module)) else launch.script, *launch.script_args]
    shown = (target.fn, (*target.args, *target.kwargs.values())) if isinstance(target, Call) else None
    if launch.nnodes > 1:
        return nodes.run(launch, (cwd, path0, argv, target), caller, shown)

    def attempt(restart_count: int):
        # Without --master-port torchrun picks a free port, and names the master "localhost"; here it is
        # 127.0.0.1, where a rank's loopback store listens: a client that tried ::1 first waited 0.3-0.7 s.
        # Each attempt's rank 0 hosts a new store: a restart reads nothing the last attempt wrote (restarts.py)
        port = launch.master_port or free_port()
        env = environ.common(launch.nproc_per_node, launch.master_addr, port, launch.run_id, launch.role,
                             restart_count=restart_count, max_restarts=launch.max_restarts)
        return spawn_call.run_fresh(run_as_rank, (env, cwd, path0, argv, target), launch.nproc_per_node,
                                    launch.timeout, caller, shown, output=launch.output, profile=launch.profile,
                                    park=restart_count == launch.max_restarts)  # %debug: the last attempt's rank

    return restarts.run(launch.max_restarts, attempt, caller.name)
