"""How the suite is shared between xdist's workers (tests/scheduling.py)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
from scheduling import BROWSER, SLURM, check_scopes, longest_first, make_scheduler, scope_of
from timing import CACHE_KEY, TimeTable, kind_of

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("nodeid, scope", [
    ("tests/browser/test_widgets_in_lab.py::test_mesh_explorer", BROWSER),
    ("tests/browser/test_hub_in_lab.py::test_two_learners_run_the_course_at_once", BROWSER),
    ("tests/test_hub_testbed.py::test_a_hub_that_cannot_start_its_proxy_says_so_and_leaves_nothing", BROWSER),
    ("tests/test_slurm_launcher.py::test_slurm_script_writes_what_sbatch_runs", SLURM),
    ("tests/test_torchrun_slurm.py::test_a_cell_runs_on_two_nodes", SLURM),
    ("notebooks/07_two_machines.ipynb::Cell 3", SLURM),  # its SLURM section uses the session's testbed
    ("notebooks/06_pipeline.ipynb::Cell 3", "notebooks/06_pipeline.ipynb"),
    ("tests/test_spawn.py::test_x[spawn]", "tests/test_spawn.py"),
    ("tests/test_slurm_units.py::test_script", "tests/test_slurm_units.py"),  # no testbed: a file of its own
])
def test_each_test_runs_in_its_files_scope_or_its_components_group(nodeid, scope):
    assert scope_of(nodeid, ROOT) == scope


def item(nodeid, fixtures=()):
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures), get_closest_marker=lambda name: None)


def test_a_test_that_would_start_a_second_testbed_is_refused_at_collection():
    check_scopes([item("tests/test_slurm_launcher.py::test_x", ["slurm"])], ROOT, kind_of)
    with pytest.raises(RuntimeError, match=r"tests/test_spawn.py::test_x \(SLURM test, scope 'tests/test_spawn.py'\)"):
        check_scopes([item("tests/test_spawn.py::test_x", ["slurm_clean"])], ROOT, kind_of)


def _handed_out(config, collection, file_seconds):
    """The order in which make_scheduler's scheduler sends ``collection``'s scopes to one worker."""
    sched = make_scheduler(config, None, file_seconds)
    sent = []

    class Node:  # the part of xdist's WorkerController the scheduler uses here
        send_runtest_some = staticmethod(sent.append)

    node = Node()
    sched.registered_collections = {node: collection}
    sched.workqueue = OrderedDict()
    for n in collection:
        sched.workqueue.setdefault(scope_of(n, ROOT), {})[n] = False
    for _ in sched.workqueue.copy():
        sched._assign_work_unit(node)
    return [collection[i] for indices in sent for i in indices]


COLLECTION = ["tests/a.py::t", "tests/test_slurm_launcher.py::t", "tests/b.py::t", "tests/browser/test_b.py::t"]


def test_without_timings_the_component_groups_go_first_then_xdists_order(pytestconfig, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])  # as `-n 2` sets it
    assert _handed_out(pytestconfig, COLLECTION, {}) == [
        "tests/browser/test_b.py::t", "tests/test_slurm_launcher.py::t", "tests/a.py::t", "tests/b.py::t"]


def test_with_the_last_runs_timings_the_longest_file_goes_first_after_the_groups(pytestconfig, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])
    seconds = {"tests/a.py": 3.0, "tests/b.py": 114.0, "tests/browser/test_b.py": 1.0}
    assert _handed_out(pytestconfig, COLLECTION, seconds) == [
        "tests/browser/test_b.py::t", "tests/test_slurm_launcher.py::t", "tests/b.py::t", "tests/a.py::t"]


def test_a_scope_the_last_run_did_not_time_counts_as_the_median():
    seconds = {"tests/a.py": 1.0, "tests/b.py": 10.0, "tests/c.py": 100.0, "notebooks/00_start_here.ipynb": 60.0}
    scopes = ["tests/a.py", "tests/new.py", "tests/b.py", "tests/c.py", "notebooks/00_start_here.ipynb"]
    # median of 1, 10, 100 and 60: 35 s, so the new file goes between b.py and the notebook
    assert longest_first(scopes, seconds, ROOT) == [
        "tests/c.py", "notebooks/00_start_here.ipynb", "tests/new.py", "tests/b.py", "tests/a.py"]
    assert longest_first(["tests/x.py", SLURM, "tests/y.py", BROWSER], {}, ROOT) == [
        BROWSER, SLURM, "tests/x.py", "tests/y.py"]


def test_a_runs_file_seconds_are_kept_in_pytests_cache_for_the_next_run():
    """The controller's time table writes each file's seconds; files this run did not run keep theirs."""
    class Cache(dict):
        def get(self, key, default):
            return super().get(key, default)

        def set(self, key, value):
            self[key] = value

    cache = Cache({CACHE_KEY: {"tests/old.py": 7.0, "tests/a.py": 99.0}})
    table = TimeTable()
    table.tests = {"tests/a.py::x": ("unit", 1.0), "tests/a.py::y": ("unit", 2.0),
                   "notebooks/n.ipynb::Cell 0": ("notebooks", 4.0)}
    session = SimpleNamespace(config=SimpleNamespace(cache=cache))
    table.pytest_sessionfinish(session)
    assert cache[CACHE_KEY] == {"tests/old.py": 7.0, "tests/a.py": 3.0, "notebooks/n.ipynb": 4.0}
    worker = SimpleNamespace(config=SimpleNamespace(cache=Cache(), workerinput={}))
    table.pytest_sessionfinish(worker)  # a worker's table is not the run's
    assert worker.config.cache == {}
