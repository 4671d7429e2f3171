"""How the kernel reaches a cluster's ranks: what a ``Cluster`` hands the parts it owns.

The Cluster (controller.py) keeps its state machine to itself. Its job runner (job_running.py) and its
post-mortems (debug/post_mortem.py) are handed a ``RankLinks`` and read only that, as torchtitan hands each
parallelism one ``ParallelDims``: they never reach into the Cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ppkit.cluster.inbox import Inbox
from ppkit.cluster.launchers.base import Launcher
from ppkit.cluster.output import RankPrinter


@dataclass(frozen=True)
class RankLinks:
    """The ranks' side of a cluster, as its parts use it.

    ``send(rank, msg)`` is False when the rank is gone; ``conns``: this generation's connection by rank,
    a live read-only view of the cluster's own dict. The contract: the cluster owns that dict and changes
    it only in place (a rank's connection added as it joins, removed as it is lost, all cleared at a
    restart; never a new dict), so the one ``RankLinks`` made with the cluster stays current for every
    generation; the parts read it and cannot write it. ``inbox`` is where every rank's messages arrive;
    ``printer`` prints what ranks write under the cell."""

    world_size: int
    inbox: Inbox
    send: Callable[[int, object], bool]
    conns: Mapping[int, object]
    launcher: Launcher
    printer: RankPrinter

    def __post_init__(self):
        if not isinstance(self.conns, MappingProxyType):
            object.__setattr__(self, "conns", MappingProxyType(self.conns))
