"""torchft's lighthouse as a process of its own: ``python _lighthouse_process.py MIN_REPLICAS JOIN_MS HEARTBEAT_MS``.

It binds 127.0.0.1 on a port the kernel picks, prints ``listening <port>`` and serves until it is killed.
torchft's extension module is loaded by itself, without ``torchft/__init__.py``, which imports torch: the
lighthouse is Rust and needs none of it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import signal
import sys

try:
    from ._child import die_with_parent
except ImportError:  # run by path, as a script
    from _child import die_with_parent


def load_torchft_extension():
    package = importlib.util.find_spec("torchft")
    if package is None:
        sys.exit("torchft is not installed")
    folder = package.submodule_search_locations[0]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(folder, "_torchft" + suffix)
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("torchft._torchft", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    sys.exit(f"torchft at {folder} has no _torchft extension module for this Python")


def main(min_replicas: int, join_timeout_ms: int, heartbeat_timeout_ms: int) -> None:
    die_with_parent()
    server = load_torchft_extension().LighthouseServer(
        bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=join_timeout_ms,
        heartbeat_timeout_ms=heartbeat_timeout_ms)
    print("listening", server.address().rsplit(":", 1)[1], flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.shutdown()


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main(*map(int, sys.argv[1:4]))
