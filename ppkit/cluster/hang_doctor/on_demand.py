"""``ppkit.collective_doctor()``: the doctor on demand, from a cell, about a cluster's ranks as they are now."""

from __future__ import annotations

from ppkit.cluster.hang_doctor import outcomes
from ppkit.cluster.hang_doctor.analysis import Diagnosis, diagnose
from ppkit.errors import ClusterStateError


def collective_doctor(cluster=None) -> Diagnosis:
    """Read every rank's flight record now and say where the ranks' collectives disagree.

    ``cluster``: a ``ppkit.Cluster`` (default: the one ``%%ranks`` runs on). Useful after a run timed
    out with ranks still blocked (the cluster waits for ``cluster.restart()``): their reader threads
    still answer. The result prints as the doctor's text; ``.problem`` says whether it found one.

    >>> ppkit.collective_doctor(cluster)      # doctest: +SKIP
    [ppkit] collective doctor (torch's flight record of each rank):
      group 0 (the default group, ranks [0, 1]): every rank that answered completed collective #1 ...
    """
    if cluster is None:
        from ppkit.cluster import session

        cluster = session.active()
        if cluster is None:
            raise ClusterStateError("collective_doctor() has no cluster to look at: no %%ranks cell has started "
                                    "one. Pass yours: ppkit.collective_doctor(cluster).")
    if cluster.state in ("closed", "starting"):
        raise ClusterStateError(f"collective_doctor() cannot ask this cluster's ranks: it is {cluster.state}. "
                                "Start one (ppkit.start(N)) and run the code whose collectives you doubt.")
    records = cluster.flight_records()
    ended, failed = outcomes.last_job(cluster.last_job_results)  # a rank that raised is not "still computing"
    return diagnose(records, cluster.world_size, ended, failed)
