"""``ppkit.collective_doctor()``: the doctor on demand, from a cell, about a cluster's ranks as they are now."""

from __future__ import annotations

from ppkit.cluster.hang_doctor import outcomes
from ppkit.cluster.hang_doctor.analysis import Diagnosis, diagnose
from ppkit.errors import ClusterStateError

_last_run: list = [None]  # what collective_doctor() says without a cluster: the reading of the latest ppkit.spawn
# or %%torchrun run, or, where that run ended otherwise, a Diagnosis with no records that says how it ended


def remember(diagnosis: Diagnosis | None, caller: str) -> None:
    """A ppkit.spawn or %%torchrun run failed with the doctor's reading ``diagnosis`` (None: it read none):
    kept for ``collective_doctor()``, in place of any earlier run's."""
    if diagnosis is None:
        diagnosis = _nothing(f"the last {caller} run failed before the doctor read its records: nothing to read")
    else:
        diagnosis.source = f"the records of the last {caller} run, which failed; read as it ended, not now"
    _last_run[0] = diagnosis


def succeeded(caller: str, checked: Diagnosis | None = None) -> None:
    """A ppkit.spawn or %%torchrun run ended without error: an earlier run's reading is no longer the last run's.
    ``checked``: the doctor's check at its end of the records its ranks sent (None: it had none of some rank's,
    or no collective to compare); where it found a problem, that reading is what was printed, and stays."""
    earlier = "an earlier failed run's reading is on that run's error, as .diagnosis"
    if checked is not None and checked.problem:
        checked.source = (f"the records of the last {caller} run, which completed: what the check at its end found, "
                          "read as it ended, not now")
        _last_run[0] = checked
    elif checked is not None:
        _last_run[0] = _nothing(f"the last {caller} run ended without error, and the records its ranks sent as they "
                                f"ended show no problem; {earlier}")
    else:
        _last_run[0] = _nothing(f"the last {caller} run ended without error; the doctor had no record of every rank "
                                f"to compare at its end, or no collective was made; {earlier}")


def _nothing(why: str) -> Diagnosis:
    return Diagnosis(groups=[], p2p={}, deadlock=[], ended={}, unanswered=[], off=[], source=why)


def last_run() -> Diagnosis | None:
    """What ``collective_doctor()`` without a %%ranks cluster returns: the last run's reading, if any."""
    return _last_run[0]


def collective_doctor(cluster=None) -> Diagnosis:
    """Read every rank's flight record now and say where the ranks' collectives disagree.

    ``cluster``: a ``ppkit.Cluster`` (default: the one ``%%ranks`` runs on; without one, what the doctor
    read as the last ``ppkit.spawn`` / ``%%torchrun`` run failed, or that the last run ended without
    error). Useful after a run timed out with ranks still blocked (the cluster waits for
    ``cluster.restart()``): their reader threads still answer. The result prints as the doctor's text;
    ``.problem`` says whether it found one; ``.records`` holds the records, and ``.write_dumps(folder)``
    writes them as torch's dump files.

    >>> ppkit.collective_doctor(cluster)      # doctest: +SKIP
    [ppkit] collective doctor (torch's flight record of each rank):
      group 0 (the default group, ranks [0, 1]): every rank that answered completed collective #1 ...
    """
    if cluster is None:
        from ppkit.cluster import session

        cluster = session.active()
        if cluster is None and last_run() is not None:
            return last_run()
        if cluster is None:
            raise ClusterStateError("collective_doctor() has no cluster to look at: no %%ranks cell has started "
                                    "one, and no ppkit.spawn or %%torchrun run has failed. Pass yours: "
                                    "ppkit.collective_doctor(cluster).")
    if cluster.state in ("closed", "starting"):
        raise ClusterStateError(f"collective_doctor() cannot ask this cluster's ranks: it is {cluster.state}. "
                                "Start one (ppkit.start(N)) and run the code whose collectives you doubt.")
    records = cluster.flight_records()
    ended, failed = outcomes.last_job(cluster.last_job_results)  # a rank that raised is not "still computing"
    return diagnose(records, cluster.world_size, ended, failed)
