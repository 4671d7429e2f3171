"""How the kernel reaches a cluster's ranks: what a ``Cluster`` hands the parts it owns.

The Cluster (controller.py) keeps its state machine to itself. Its job runner (job_running.py) and its
post-mortems (debug/post_mortem.py) are handed a ``RankLinks`` and read only that, as torchtitan hands each
parallelism one ``ParallelDims``: they never reach into the Cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ppkit.cluster.inbox import Inbox
from ppkit.cluster.launchers.base import Launcher
from ppkit.cluster.output import RankPrinter


@dataclass(frozen=True)
class RankLinks:
    """The ranks' side of a cluster, as its parts use it.

    ``send(rank, msg)`` is False when the rank is gone; ``conns`` is the cluster's own dict of this
    generation's connection by rank (kept up to date by the cluster, read here); ``inbox`` is where
    every rank's messages arrive; ``printer`` prints what ranks write under the cell."""

    world_size: int
    inbox: Inbox
    send: Callable[[int, object], bool]
    conns: dict[int, object]
    launcher: Launcher
    printer: RankPrinter
