"""Post-mortem on a rank: ``cluster.debug()``, and IPython's ``%debug`` after a rank's error.

A rank keeps the exception its last job raised until its next job starts (transport/debug/rank_pdb.py).
``debug`` asks it to open pdb on that traceback, at the frame that raised, with its locals; the
prompts come through the kernel's stdin as for a breakpoint (sessions.py). The session runs in
a thread of its own on the rank, so a cluster left broken by the error (other ranks still blocked
in a collective) can still be looked at before ``restart()``.
"""

from __future__ import annotations

import sys
import time

from ppkit.cluster.debug import parked
from ppkit.cluster.debug.sessions import Sessions
from ppkit.cluster.inbox import Closed
from ppkit.cluster.links import RankLinks
from ppkit.errors import ClusterStateError, ConfigError, DebuggerQuit, ProcessRaisedError, RemoteError
from ppkit.transport.debug.messages import DebugLeft, DebugLine, DebugPrompt, PostMortem

POLL_S = 0.5


class PostMortems:
    """A cluster's post-mortems (``Cluster.debug``): handed the cluster's ``RankLinks`` and nothing else."""

    def __init__(self, links: RankLinks):
        self._links = links

    def open(self, rank: int, generation: int) -> None:
        """pdb on ``rank`` (of the cluster's worker ``generation``) at the frame that raised in its last job,
        until the learner's ``c`` or ``q``. The caller holds the job runner's lock: no job runs meanwhile."""
        links = self._links
        if not links.send(rank, PostMortem()):
            raise ClusterStateError(f"rank {rank} is gone (its process ended): there is no traceback to look "
                                    "at. cluster.restart(), run the job again, then cluster.debug().")
        sessions = Sessions(links.send, links.printer.interject)  # world_size 0: no other ranks to mention
        others = []
        try:
            while True:
                item = links.inbox.next(time.monotonic() + POLL_S)
                if item is None:
                    continue
                if item.source != rank or item.generation != generation:
                    others.append(item)
                elif isinstance(item.msg, Closed):
                    raise ClusterStateError(f"rank {rank} died during its post-mortem: cluster.restart().")
                elif isinstance(item.msg, DebugPrompt) and sessions.ended is None:
                    sessions.take(rank, item.msg)
                    if sessions.ended is not None:  # interrupted, or no stdin: pdb on the rank must end too
                        links.send(rank, DebugLine("q"))
                elif isinstance(item.msg, DebugLeft):
                    sessions.take(rank, item.msg)
                    _check_ended(item.msg, sessions, rank)
                    return
                else:
                    others.append(item)
        finally:
            links.printer.flush()
            links.inbox.put_back(others)


def _check_ended(left: DebugLeft, sessions: Sessions, rank: int) -> None:
    """Raise what stopped the post-mortem on ``rank``, if it did not end with the learner's ``c`` or ``q``."""
    if left.problem:
        raise ClusterStateError(left.problem)
    ended = sessions.ended
    if ended is not None and ended.how == "no stdin":
        raise DebuggerQuit("cluster.debug() needs to ask for pdb commands, but this front end does not allow input "
                           "(nbval, jupyter nbconvert --execute, ...). Run it in JupyterLab or IPython.",
                           rank, "no stdin", ended.where, False)
    if ended is not None and ended.how == "interrupted":
        print(f"[ppkit] interrupted: the post-mortem on rank {rank} ended.")


def rank_to_debug(rank: int | None, world_size: int) -> int:
    if rank is None:
        error = getattr(sys, "last_value", None)
        if not isinstance(error, RemoteError) or not error.ranks:
            raise ConfigError("cluster.debug() opens pdb where a rank's last job raised, but no rank's error was "
                              "the last one here. Say which rank: cluster.debug(rank=1).")
        rank = min(error.ranks)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"this cluster has ranks 0..{world_size - 1}, not {rank!r}: cluster.debug(rank=1).")
    return rank


def debug_magic(original, active_cluster):
    """IPython's ``%debug``, which after a rank's error opens pdb on that rank (``active_cluster()``:
    the cluster to ask); after any other error, or with arguments, IPython's own."""

    def debug(line: str = "", cell: str | None = None):
        error = getattr(sys, "last_value", None)
        if line.strip() or cell is not None or not isinstance(error, RemoteError) or not error.ranks:
            return original(line, cell)
        if isinstance(error, ProcessRaisedError):
            found = parked.find(error)
            if found is not None:  # the rank that raised was kept for this
                cluster, rank = found
                return cluster.debug(rank)
            print(f"[ppkit] the process that raised is gone: ppkit.spawn and %%torchrun keep it for %debug until "
                  f"the end of the cell after the failing one (or {parked.PARK_S:g} s, or the next call). Run the "
                  "cell again, then %debug in the next cell; or put breakpoint() where it fails.")
            return None
        cluster = active_cluster()
        if cluster is None:
            print("[ppkit] no running cluster here kept that error: call cluster.debug() on the one that ran it.")
            return None
        return cluster.debug()

    debug.ppkit_wraps = original
    return debug


def register(ipython, active_cluster) -> None:
    """Put ppkit's ``%debug`` in front of IPython's (once)."""
    original = ipython.magics_manager.magics["line"].get("debug")
    if original is None or hasattr(original, "ppkit_wraps"):
        return
    try:  # the method itself: IPython may list a lazy stand-in, which would find this wrapper once it is in
        original = ipython.magics_manager.registry["ExecutionMagics"].debug
    except (KeyError, AttributeError):
        pass
    ipython.register_magic_function(debug_magic(original, active_cluster), magic_kind="line_cell",
                                    magic_name="debug")
