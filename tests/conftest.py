"""Shared fixtures: small real clusters (ppkit and SLURM), and a check that no ppkit process outlives a test."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import slurm_session
from faultlog import FaultLog
from leftovers import LEFTOVER_WAIT_S, end_leftovers, ppkit_children, wait_gone  # noqa: F401  (re-exported for tests/browser)
from slurm_testbed import SlurmMissing, SlurmTestbedError

import ppkit

THREADS_END_WITHIN_S = 2.0  # what a module's ending threads get before its garbage is collected


def pytest_configure(config):
    _answer_interrupts()
    if os.environ.get("PPKIT_FAULT_LOG"):  # a crash log that survives the process (tests/faultlog.py)
        config.pluginmanager.register(FaultLog(os.environ["PPKIT_FAULT_LOG"]), "ppkit-faultlog")


def _answer_interrupts() -> None:
    """Let SIGINT raise KeyboardInterrupt in this process (and so in the kernels the tests start), even when
    the suite was started with SIGINT ignored.

    A shell without job control starts `make test &` (or `nohup ... &`) with SIGINT ignored, an ignored
    signal stays ignored across exec, and Python then installs no handler for it. The tests of Kernel >
    Interrupt (test_spawn.py, test_cluster_hardening.py interrupt this process; test_cluster_lifecycle.py
    interrupts a kernel subprocess) then ran on to their 60 s job timeouts and failed. A Jupyter kernel always
    turns SIGINT into KeyboardInterrupt, whatever it inherited; so does this, in the main thread only.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="module")
def _free_module_garbage():
    """Free what each test module left in reference cycles at the end of that module.

    Closed clusters with their threads, sockets and Popen objects, exceptions whose tracebacks hold
    frames: left alone, they are freed by the next full collection, inside whichever later test
    allocates enough to start one. A crash in a finalizer then shows an unrelated test's stack, as
    issue 23's "Fatal Python error: Aborted" did (garbage collection inside the matplotlib tests of
    test_widgets_sharding.py, right after test_spawn_launcher.py). Collected here, after the
    module's own fixtures are gone, the stack names the module that made the garbage. Threads the
    module started are given a moment to end first: a closed cluster's accept and reader threads
    still hold it, and it becomes garbage only when they return.
    """
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREADS_END_WITHIN_S
    for thread in set(threading.enumerate()) - before:  # some (a kept fork server's) run on: bounded
        thread.join(max(0.0, deadline - time.monotonic()))
    gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _close_spawns_kept_clusters():
    """Stop the fork servers that ``ppkit.spawn`` and ``%%torchrun`` keep between calls (a failed call's cluster
    too, kept for ``%debug``) at the end of each test module, as the kernel's exit does.

    Kept, they outlived the module that made them (any in-process ``ppkit.spawn`` leaves one, a timed-out call's
    cluster "broken") and were found by the next module's leftover check: the 2026-11-29 CI runs failed
    test_rpc_world, test_pipelining_failures and notebook 02 for fork servers that test_flight_record and
    test_hang_watch_output had left."""
    yield
    from ppkit.cluster.spawn import call as spawn_call

    spawn_call.close()


@pytest.fixture(autouse=True, scope="session")
def _mark_owner():
    # children inherit this, so leftovers from *this* run can be told from other runs' processes
    os.environ["PPKIT_TEST_OWNER"] = str(os.getpid())
    yield


@pytest.fixture(scope="session")
def _rpc_capacity():
    """Start this test process's first RPC world with as many workers as any test uses.

    torch keeps the first RPC world's worker table for RRefs for the whole process, so a later,
    larger world is refused (see ppkit.cluster.rpc.world); tests run in one process, in any order.
    Started once, before the first test of a module that uses RPC (``_rpc_first_world``), so a run
    without such a module (one file, `-k`) does not pay its ~4 s.
    """
    with ppkit.start_rpc(2):
        pass
    yield


@pytest.fixture(autouse=True, scope="module")
def _rpc_first_world(request):
    """Before a module whose source mentions RPC at all (start_rpc, torch.distributed.rpc, the RPC pipeline):
    the capacity world. Module scope and autouse, so it comes before the module's own RPC fixtures."""
    path = getattr(getattr(request, "module", None), "__file__", None)
    if path is None or "rpc" in Path(path).read_text(encoding="utf-8").lower():
        request.getfixturevalue("_rpc_capacity")


# Clusters that module-scoped fixtures keep open across tests: no_leftovers looks past their processes.
_shared: list[ppkit.Cluster] = []


@pytest.fixture
def no_leftovers():
    """Fail the test if it leaves a ppkit worker or fork server running (a shared fixture's cluster aside); what
    it left is then killed, so that the next test's check does not fail for it too."""
    yield
    kept = {p.pid for cluster in _shared for p in cluster.processes()}
    left = end_leftovers([p.pid for p in ppkit_children() if p.pid not in kept], timeout=LEFTOVER_WAIT_S)
    assert not left, f"leftover ppkit processes (now killed): {left}"


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
