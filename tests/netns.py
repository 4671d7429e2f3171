"""The ``two_hosts`` fixture: two network namespaces as two machines (see ppkit/cluster/tools/netns.py).

Import it into a test module (``from netns import two_hosts``). Tests that use it skip, with the
reason, where namespaces cannot be made (not Linux, not root, no ``ip``). The namespaces are
deleted after the test even when it fails: a finalizer plus try/finally.
"""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time

import pytest

from ppkit.cluster.tools import netns

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
# what each simulated host must decide for itself, not inherit from the test runner
LAUNCH_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT", "RANK",
               "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")


def skip_without_netns() -> None:
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(f"two-host tests need network namespaces: {reason}")


@pytest.fixture
def two_hosts(request):
    skip_without_netns()
    hosts = netns.TwoHosts(bridge=True)
    request.addfinalizer(hosts.close)  # runs even if the test body below raises
    try:
        yield hosts
    finally:
        hosts.close()


def host_env(key: str, **extra) -> dict:
    """The environment for a process on a simulated host: this checkout's ppkit, and the key."""
    path = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**env, "PYTHONPATH": path, "PPKIT_KEY": key, "PYTHONUNBUFFERED": "1", **extra}


class Lines:
    """Read a process's stdout in a thread, so a test can wait for one line with a deadline.

    ``when`` is the ``time.monotonic()`` at which the last line ``wait_for`` matched arrived.
    """

    def __init__(self, proc):
        self.proc, self.seen, self._q = proc, [], queue.Queue()
        self.when: float | None = None
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self._q.put((time.monotonic(), line))
        self._q.put((time.monotonic(), None))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                when, line = self._q.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                self.when = when
                return match
        raise AssertionError(f"no line matching {pattern!r}; output so far:\n{''.join(self.seen)}")

    def rest(self, timeout: float) -> str:
        self.proc.wait(timeout=timeout)
        while True:
            _, line = self._q.get(timeout=5)
            if line is None:
                return "".join(self.seen)
            self.seen.append(line)
