"""Was a worker killed by the kernel's out-of-memory killer? Its cgroup's oom_kill count says.

A worker that takes more memory than the learner's limit allows is ended by the kernel with SIGKILL, which
on its own reads like a mystery ("killed by signal SIGKILL"). The kernel counts each such kill in the
memory cgroup (v2 ``memory.events``, v1 ``memory.oom_control``: ``oom_kill N``), before it sends the
signal. The local workers are forked from this kernel, so they share its cgroup: a count that rose since
they started names the cause, the limit and what to do.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from ppkit.cluster.memory import MemoryLimit, gib, read_memory_limit

ADVICE = ("Use less memory (a smaller batch, model or number of ranks; close other notebooks' clusters), or ask "
          "the instructor for more: docs/memory.md lists what each notebook needs, and `ppkit preflight` "
          "says which notebooks fit in this limit")  # no full stop: the caller's sentence goes on


def kill_count(cgroup: Path | None, version: int | None) -> int | None:
    """The cgroup's oom_kill count, or None where it cannot be read (no cgroup, an old kernel, no access)."""
    if cgroup is None:
        return None
    file = cgroup / ("memory.events" if version == 2 else "memory.oom_control")
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


@dataclass(frozen=True)
class OomWatch:
    """The count when the workers started (``kills_at_start``) and the limit then."""
    limit: MemoryLimit
    kills_at_start: int | None

    @classmethod
    def start(cls, limit: MemoryLimit | None = None) -> OomWatch:
        limit = read_memory_limit() if limit is None else limit
        return cls(limit, kill_count(limit.cgroup, limit.version))

    def kills_since_start(self) -> int | None:
        now = kill_count(self.limit.cgroup, self.limit.version)
        return None if now is None or self.kills_at_start is None else now - self.kills_at_start

    def explain(self, status: int | None) -> str:
        """Why a process that ended with wait status ``status`` ended, where SIGKILL and the count tell
        ("" for any other end). Starts with "; " so it follows describe_status's words. With no status
        (it was not reported in time), a count that rose is still named."""
        kills = self.kills_since_start()
        where = self.limit.cgroup
        if status is None and kills:  # e.g. the killer also ended the fork server, which reports exit statuses
            return (f"; the oom_kill count of cgroup {where} rose by {kills} since the workers started, so it was "
                    "most likely killed for lack of memory: it ran OUT OF MEMORY. (Its exit status was not reported: "
                    "the out-of-memory killer may have ended the process that reports it too, a fork server.) "
                    f"The limit is {gib(self.limit.bytes)} "
                    f"({self.limit.source}), for this kernel and all its workers together. {ADVICE}")
        if status is None or not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGKILL:
            return ""
        if kills is None:
            return ("; if memory ran out, the kernel's out-of-memory killer sends SIGKILL, but this machine's "
                    "cgroup does not say (no oom_kill count to read): compare the notebook's memory with "
                    f"the limit, {self.limit}. {ADVICE}")
        if kills == 0:
            return (f"; not by the out-of-memory killer (the oom_kill count of cgroup {where} did not change): "
                    "something else sent SIGKILL (a `kill -9`, the job system, the instructor)")
        return (f"; it ran OUT OF MEMORY: the kernel's out-of-memory killer ended it, as the oom_kill count of "
                f"cgroup {where} shows ({kills} kill(s) since the workers started). The memory limit "
                f"is {gib(self.limit.bytes)} ({self.limit.source}), for this kernel and all its workers "
                f"together. {ADVICE}")
