"""The spare fork server: a closed cluster's fork server, kept (torch imported) for the next cluster to fork from.

A new ``Cluster`` spends most of its start in its fork server's ``import torch`` (1.3 of 1.5 s on a 2-core machine;
a ``restart()``, which keeps the fork server, takes 0.15 s). Notebooks start clusters again and again: a cell re-run,
``with ppkit.start(2) as cluster:`` in each section, ``ppkit.spawn`` with another process count. So when a cluster
closes, its fork server, its workers stopped, is parked rather than ended: it leaves the cluster's control channel
and waits, with nothing open, for one line on its stdin from this kernel that names the next cluster's address and
key. It exits after ``PPKIT_SPARE_S`` seconds unused (default 60; 0 turns spares off), and with the kernel, as every
fork server does. One is kept at most.

A spare is used only by a cluster that would have started the same process: same isolation mode, Python, working
directory and environment (a variable set in between, such as ``GLOO_SOCKET_IFNAME``, may be read when torch is
imported). Otherwise it is stopped and a fresh fork server starts, as without spares.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ppkit.transport import channel, procs
from ppkit.transport.zygote import PRELOAD_ENV

SPARE_S_ENV = "PPKIT_SPARE_S"
DEFAULT_SPARE_S = 60.0
MARGIN_S = 5.0  # a spare this close to its own end is not handed a cluster: it could leave as it is told


@dataclass
class Spare:
    process: subprocess.Popen
    fingerprint: tuple
    ends: float  # time.monotonic() at which it leaves unused


_spare: Spare | None = None
_lock = threading.Lock()


def park_seconds() -> float:
    """How long a closed cluster's fork server waits for the next cluster (``PPKIT_SPARE_S``); 0: not at all."""
    try:
        return max(0.0, float(os.environ.get(SPARE_S_ENV, DEFAULT_SPARE_S)))
    except ValueError:
        return DEFAULT_SPARE_S


def fingerprint(mode: str) -> tuple:
    """What a fork server's start depends on: a spare is used only where this is unchanged since it started."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k != PRELOAD_ENV))
    return mode, sys.executable, os.getcwd(), env


def keep(process: subprocess.Popen, started_as: tuple, seconds: float) -> None:
    """Keep ``process``, a fork server just told to park for ``seconds``, for the next cluster (and stop the spare
    kept before it)."""
    global _spare
    with _lock:
        old, _spare = _spare, Spare(process, started_as, time.monotonic() + seconds)
    if old is not None:
        _stop(old)


def take(mode: str, address, key: bytes, log_path: Path) -> tuple[subprocess.Popen, tuple] | None:
    """The spare and the fingerprint it started with, handed on to connect to ``address`` with ``key`` and to write
    to ``log_path``; None if there is none that fits (a fresh fork server is then started, as without spares)."""
    global _spare
    with _lock:
        spare, _spare = _spare, None
    if spare is None:
        return None
    fits = (not procs.exited(spare.process) and spare.fingerprint == fingerprint(mode)
            and time.monotonic() < spare.ends - MARGIN_S)
    if fits:
        told = {"addr": channel.format_address(address), "key": key.hex(), "log": str(log_path),
                "preload": os.environ.get(PRELOAD_ENV, "")}
        try:
            spare.process.stdin.write((json.dumps(told) + "\n").encode())
            spare.process.stdin.flush()
        except (OSError, ValueError):  # it ended meanwhile
            fits = False
    if not fits:
        _stop(spare)
        return None
    return spare.process, spare.fingerprint


def pid() -> int | None:
    """The waiting spare's pid, if one waits (tools that look for leftover processes pass over it)."""
    spare = _spare
    return spare.process.pid if spare is not None and not procs.exited(spare.process) else None


def pipe_fd() -> int | None:
    """This process's end of the waiting spare's stdin pipe, if one waits (leak checks pass over it too)."""
    spare = _spare
    try:
        return spare.process.stdin.fileno() if spare is not None and not procs.exited(spare.process) else None
    except (OSError, ValueError):
        return None


def discard() -> None:
    """Stop the waiting spare, if any (at the kernel's exit; its end would stop it too)."""
    global _spare
    with _lock:
        spare, _spare = _spare, None
    if spare is not None:
        _stop(spare)


def _stop(spare: Spare) -> None:
    try:
        spare.process.stdin.close()  # EOF: a parked fork server leaves by itself
    except (OSError, ValueError):
        pass
    procs.stop_processes([spare.process], grace=1.0)


atexit.register(discard)
