"""RankLinks, what a Cluster hands the parts it owns: its connections are the cluster's own, seen live
and read-only (links.py's contract)."""

from __future__ import annotations

import pytest

from ppkit.cluster.links import RankLinks


def test_the_links_see_the_clusters_connections_live_and_cannot_change_them():
    conns = {0: "generation 1, rank 0"}
    links = RankLinks(1, inbox=None, send=lambda rank, msg: True, conns=conns, launcher=None, printer=None)
    conns.clear()  # what the cluster does at a restart: the same dict, changed in place
    conns[0] = "generation 2, rank 0"
    assert links.conns[0] == "generation 2, rank 0" and dict(links.conns) == conns
    with pytest.raises(TypeError):
        links.conns[1] = "a part's own connection"
    assert 1 not in conns
