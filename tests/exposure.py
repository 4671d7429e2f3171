"""What another user of this machine can reach of a set of processes (issue 24, part 2).

    found = exposure(pids, other.uid, other.gid)   # pids: a learner's kernel, fork server, workers
    assert counts(found)[OPEN] == 0, table(found)

The listing and the verdicts are ppkit's own (ppkit/cluster/exposure.py: ``challenge``, ``open``,
``unreachable``); this module tries each endpoint as another user, from that user's place on the
machine: in a forked child of this (root) process that drops to that user's uid and gid first,
one child per endpoint (a joined namespace cannot be left).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

from ppkit.cluster.exposure import (  # noqa: F401  (re-exported for tests)
    CHALLENGE,
    OPEN,
    UNREACHABLE,
    VERDICTS,
    Endpoint,
    Finding,
    counts,
    listeners,
    try_endpoint,
)


def probe(endpoints, uid: int, gid: int) -> list[Finding]:
    """Try every endpoint as user ``uid``/``gid``: in a forked child that drops root first, one
    child per endpoint (joining a namespace cannot be undone)."""
    findings = []
    for endpoint in endpoints:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become the other user, try, write the verdict, leave
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                found = try_endpoint(endpoint)
                os.write(write, json.dumps([found.verdict, found.detail]).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            answer = pipe.read()
        os.waitpid(pid, 0)
        verdict, detail = json.loads(answer) if answer else (UNREACHABLE, "the probe failed")
        findings.append(Finding(endpoint, verdict, detail))
    return findings


# What a kernel's code does, with what it started, while a test probes it: writes its pid to pid_file, then
# waits until done_file appears (formatted with both paths, after code that starts something).
HOLD_UNTIL_PROBED = """
open({pid_file!r}, "w").write(str(os.getpid()))
deadline = time.monotonic() + 300
while not os.path.exists({done_file!r}) and time.monotonic() < deadline:
    time.sleep(0.2)
"""


def cluster_pids(kernel_pid: int) -> list[int]:
    """The processes ppkit started under a notebook kernel (fork servers, workers), for ``exposure``.

    Not the kernel itself: in a real Jupyter kernel its ZMQ ports, like the Jupyter server's HTTP port,
    accept a connection and wait for the client's words (their authentication is inside the protocol:
    signed messages, a token), which this probe counts as open. The kernel's ppkit listeners are its
    control channel (key challenge) and, in an RPC world, TensorPipe's; pass its pid too to see them.
    """
    import psutil

    found = []
    for child in psutil.Process(kernel_pid).children(recursive=True):
        try:
            if "ppkit" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def exposure(pids, uid: int, gid: int) -> list[Finding]:
    """``probe(listeners(pids), uid, gid)``: what user ``uid`` can reach of these processes."""
    return probe(listeners(pids), uid, gid)


def table(findings) -> str:
    """One line per endpoint, for an assertion message or a report."""
    return "\n".join(f"{f.verdict:12} {f.endpoint}  {f.detail}" for f in findings) or "(no listeners)"


def as_json(findings) -> str:
    return json.dumps([{**asdict(f.endpoint), "verdict": f.verdict, "detail": f.detail} for f in findings])


if __name__ == "__main__":  # python tests/exposure.py UID GID PID...: the table, then the counts
    uid, gid, *pids = map(int, sys.argv[1:])
    result = exposure(pids, uid, gid)
    print(table(result))
    print(counts(result))
