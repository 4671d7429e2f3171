"""The ranks' side of profiling: run a job under ``torch.profiler`` and send its trace back.

A rank records CPU activities (gloo's collectives included: they are recorded on its threads) and, where
CUDA is present, CUDA activity: the kernels on each stream, NCCL's on their own; input shapes, which give
each collective its size in bytes (on by default, docs/profiling.md says what they cost); Python stacks only
when asked. While it records, another torch profiler on the rank is refused by name (one_profiler.py)."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

from ppkit.errors import ClusterStateError, ConfigError
from ppkit.profiling import one_profiler


@dataclass(frozen=True)
class Request:
    """What a profiled run records: ``record_shapes`` (each op's input shapes: a collective's size in
    bytes on its hover; on by default, ``profile=dict(record_shapes=False)`` for a smaller trace) and
    ``with_stack`` (the Python stack of each op; off unless asked: it costs time and trace size)."""

    record_shapes: bool = True
    with_stack: bool = False


def request(profile) -> Request | None:
    """``profile=`` of spawn, torchrun and cluster.profile as a Request: False/None (no profiling),
    True, a dict of Request's fields, or a Request."""
    if profile is None or profile is False:
        return None
    if profile is True:
        return Request()
    if isinstance(profile, Request):
        return profile
    if isinstance(profile, dict):
        unknown = sorted(set(profile) - {"record_shapes", "with_stack"})
        if not unknown:
            return Request(**{k: bool(v) for k, v in profile.items()})
        raise ConfigError(f"profile={profile!r} names {', '.join(map(repr, unknown))}, which the profiler does not "
                          "take. Give profile=True, or profile=dict(record_shapes=True, with_stack=True).")
    raise ConfigError(f"profile must be True, False or a dict of options, got {type(profile).__name__} "
                      f"{profile!r:.60}: profile=True, or profile=dict(with_stack=True) for Python stacks.")


def activities() -> list:
    """What the profiler records here: the CPU's ops, and the GPU's kernels where CUDA is present."""
    import torch
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def _profiler(options: Request):
    from torch.profiler import profile

    return profile(activities=activities(), record_shapes=options.record_shapes, with_stack=options.with_stack)


def profiled(body, options: Request) -> dict:
    """``body()`` under the profiler; what the kernel needs of it (``trace_of``). ``body``'s
    exception passes through, and then nothing is sent: the run's error matters more."""
    prof = _profiler(options)
    _quietly(prof.__enter__)
    one_profiler.hold()
    try:
        body()
    finally:
        one_profiler.release()
        _quietly(lambda: prof.__exit__(None, None, None))
    return trace_of(prof)


def _quietly(step) -> None:
    """``step()`` with the process's stderr (fd 2) sent nowhere: kineto writes lines such as
    ``USDT: ... profiler_start`` and, on a machine without a GPU, ``ERROR: ... gpuGetDeviceCount failed``
    straight to fd 2 whatever its log level, and every rank would print them into the cell. Only the
    profiler's start and stop are silenced (a few ms), never the learner's own code."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        step()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def recorded(values: list) -> tuple[dict[int, dict], dict[int, str]]:
    """``stop``'s values by rank: the ranks' recordings, and why each rank without one has none."""
    results = {rank: value for rank, value in enumerate(values) if isinstance(value, dict)}
    return results, {rank: "no profiler was running on it as the block ended" for rank in range(len(values))
                     if rank not in results}


def trace_of(prof) -> dict:
    """The rank's chrome trace (as torch writes it: JSON text) and where it ran. Not ``prof.events()``: building and
    sending it costs more than the rest of profiling together; the kernel rebuilds it (events.py)."""
    fd, path = tempfile.mkstemp(prefix="ppkit-profile-", suffix=".json")
    os.close(fd)
    try:
        _quietly(lambda: prof.export_chrome_trace(path))
        with open(path, encoding="utf-8") as file:
            text = file.read()  # parsed in the kernel: a str pickles and sends faster than its JSON's dicts
    finally:
        os.unlink(path)
    return {"trace_json": with_distributed_info(text, prof), "host": socket.gethostname(), "clock": clock_id(),
            "pid": os.getpid()}


def with_distributed_info(text: str, prof) -> str:
    """The trace with torch's ``distributedInfo`` (backend, rank, world size, process groups), which torch
    writes only when the process group exists as the profiler starts, and ppkit's starts before the
    learner's ``init_process_group``. Tools that read a trace per rank (HTA) need it. Added here where the
    group still exists as the profiler stops; otherwise the kernel adds the rank and the world size."""
    head = text[:text.find('"traceEvents"')]
    if '"distributedInfo"' in head or not text.lstrip().startswith("{"):
        return text
    try:
        info = prof._get_distributed_info()  # torch's own dict (torch.profiler.profile), None without a group
    except Exception:  # a torch without it, or a group being torn down: the kernel adds what it knows
        info = None
    if not info:
        return text
    start = text.index("{") + 1
    return text[:start] + '\n  "distributedInfo": ' + json.dumps(info, default=str) + "," + text[start:]


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def clock_id() -> str:
    """Which clock this process reads: the kernel's boot id, the same for every container and network
    namespace of one machine and different on every other one (a hostname is neither: a UTS namespace
    renames it, and two machines can share one). The hostname where /proc has no boot id."""
    try:
        with open(BOOT_ID, encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        return socket.gethostname()


# -- cluster.profile(): the profiler runs across several jobs of a persistent worker ---------------
_running: list = []  # this worker's profiler, between start() and stop()


def start(rank: int, world_size: int, options: Request) -> None:
    """A job: start the profiler on this worker; later jobs run under it until ``stop``."""
    if _running:
        raise ClusterStateError("a profile is already being recorded on this rank: a cluster.profile() block "
                                "cannot hold another. End the first block, then start the next.")
    prof = _profiler(options)
    _quietly(prof.__enter__)
    one_profiler.hold()
    _running.append(prof)


def stop(rank: int, world_size: int) -> dict | None:
    """A job: stop the profiler that ``start`` started and send its trace (None if none ran here)."""
    if not _running:
        return None
    prof = _running.pop()
    one_profiler.release()
    _quietly(lambda: prof.__exit__(None, None, None))
    return trace_of(prof)


def now_ns(rank: int, world_size: int) -> int:
    """A job: this rank's clock, for clocks.py's ping."""
    return time.time_ns()
