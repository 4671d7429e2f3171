"""Shared fixtures: small real clusters (ppkit and SLURM), and a check that no ppkit process outlives a test."""

from __future__ import annotations

import os
import tempfile

import pytest
import slurm_session
from leftovers import ppkit_children, wait_gone  # noqa: F401  (re-exported for tests/browser)
from slurm_testbed import SlurmMissing, SlurmTestbedError

import ppkit

# Checks run by tests and by nbval's kernels (which inherit this environment when `pytest tests notebooks`
# collects this file first) go to a scratch file, not the learner's ~/.ppkit/progress.json.
os.environ.setdefault("PPKIT_PROGRESS", os.path.join(tempfile.gettempdir(), f"ppkit-test-progress-{os.getpid()}.json"))


@pytest.fixture(autouse=True, scope="session")
def _mark_owner():
    # children inherit this, so leftovers from *this* run can be told from other runs' processes
    os.environ["PPKIT_TEST_OWNER"] = str(os.getpid())
    yield


@pytest.fixture(autouse=True, scope="session")
def _rpc_capacity():
    """Start this test process's first RPC world with as many workers as any test uses.

    torch keeps the first RPC world's worker table for RRefs for the whole process, so a later,
    larger world is refused (see ppkit.cluster.rpc.world); tests run in one process, in any order.
    """
    with ppkit.start_rpc(2):
        pass
    yield


# Clusters that module-scoped fixtures keep open across tests: no_leftovers looks past their processes.
_shared: list[ppkit.Cluster] = []


@pytest.fixture
def no_leftovers():
    """Fail the test if it leaves a ppkit worker or fork server running (a shared fixture's cluster aside)."""
    yield
    kept = {p.pid for cluster in _shared for p in cluster.processes()}
    left = wait_gone([p.pid for p in ppkit_children() if p.pid not in kept], timeout=5.0)
    assert not left, f"leftover ppkit processes: {left}"


def _shared_cluster(*args, **kwargs):
    with ppkit.Cluster(*args, **kwargs) as cluster:
        _shared.append(cluster)
        try:
            yield cluster
        finally:
            _shared.remove(cluster)


@pytest.fixture(scope="module")
def cluster2():
    yield from _shared_cluster(2, "gloo", timeout=30)


@pytest.fixture(scope="module")
def cluster4():
    yield from _shared_cluster(4, "gloo", timeout=30)


@pytest.fixture(scope="module")
def _bare6_kept():
    yield from _shared_cluster(6, "gloo", process_group=False, timeout=30)


@pytest.fixture
def bare6(_bare6_kept):
    """A 6-rank cluster without a process group, for the exercise checkers (each runs its cases in sub-worlds
    of 2..6 ranks of it): one per module instead of one per check. A checker hands it back usable (restarted
    when a case hung or a rank died); it is restarted here too if a test left it broken."""
    if _bare6_kept.state == "broken":
        _bare6_kept.restart()
    return _bare6_kept


@pytest.fixture
def fresh(cluster2):
    """The module's 2-rank cluster, restarted if a previous test broke it."""
    if cluster2.state == "broken":
        cluster2.restart()
    return cluster2


@pytest.fixture(scope="session")
def slurm():
    """The session's SLURM test cluster (tests/slurm_testbed.py: nodes n1, n2; partitions debug, one), started
    on first use; while it runs, os.environ has its SLURM_CONF, so sbatch/srun/squeue and ppkit reach it.

    Skips when SLURM is not installed (`make slurm`), and fails instead under CI=true.
    """
    try:
        tb = slurm_session.testbed()
    except SlurmMissing as exc:
        if slurm_session.in_ci():
            pytest.fail(slurm_session.missing_message(exc))
        pytest.skip(slurm_session.missing_message(exc))
    yield tb
    slurm_session.stop()  # the end of the session; pytest_sessionfinish (../conftest.py) would do it too


@pytest.fixture
def slurm_clean(slurm):
    """The SLURM test cluster; the test fails if it leaves a job in the queue (which is then cancelled)."""
    yield slurm
    try:
        slurm.wait_no_jobs(timeout=10)
    except SlurmTestbedError as exc:
        left = slurm.squeue()
        if left:
            slurm.run(["scancel", *(job["job_id"] for job in left)])
        pytest.fail(f"the test left SLURM jobs behind ({exc}); they were cancelled")


@pytest.fixture
def slurm_restore_nodes(slurm):
    """The SLURM test cluster, for a test that kills a slurmd (or downs a node): every node is back idle after it."""
    yield slurm
    slurm.restore_nodes()
