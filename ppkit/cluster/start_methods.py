"""Start methods: how this machine's workers begin (the older spelling of the launcher's name).

``forkserver`` (Linux default): a fork server imports torch once and forks each rank
(launchers/local.py), fast, but forking a process that imported torch is unsafe on macOS and
impossible on Windows. ``spawn``: each rank a fresh interpreter (launchers/spawn.py).
``auto`` picks spawn on macOS and Windows, the fork server elsewhere.
Chosen by ``ppkit.start(..., start_method=...)`` or, for every cluster of a process (the CLI, CI),
the environment variable PPKIT_START_METHOD.
"""

from __future__ import annotations

import os
import sys

from ppkit.errors import ConfigError

START_METHODS = ("auto", "forkserver", "spawn")
START_METHOD_ENV = "PPKIT_START_METHOD"


def check_start_method(value, where: str = "start_method") -> str:
    if value not in START_METHODS:
        raise ConfigError(
            f"unknown {where} {value!r}; the choices are {', '.join(map(repr, START_METHODS))}. "
            "'spawn' starts each worker as a fresh interpreter (works everywhere, slower to start), "
            "'forkserver' forks workers from a process that imported torch once (Linux), "
            "'auto' picks spawn on macOS and Windows and forkserver elsewhere.")
    return value


def resolve_start_method(value: str = "auto", platform: str = sys.platform) -> str:
    """'forkserver' or 'spawn': an explicit ``value`` wins, then $PPKIT_START_METHOD, then the platform."""
    check_start_method(value)
    if value == "auto" and os.environ.get(START_METHOD_ENV):
        value = check_start_method(os.environ[START_METHOD_ENV], START_METHOD_ENV)
    if value == "auto":
        value = "spawn" if platform in ("darwin", "win32") else "forkserver"
    return value
