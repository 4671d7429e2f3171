"""The table of where the suite's time went (tests/timing.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from timing import TimeTable, kind_of


def item(nodeid, fixtures=(), marker=None):
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures),
                           get_closest_marker=lambda name: object() if name == marker else None)


@pytest.mark.parametrize("nodeid, fixtures, marker, kind", [
    ("tests/browser/test_hub_in_lab.py::test_room", ["hub", "chromium"], None, "hub"),
    ("tests/browser/test_widgets_in_lab.py::test_slider", ["lab"], None, "browser"),
    ("notebooks/05_pipeline.ipynb::Cell 3", [], None, "notebooks"),
    ("tests/test_slurm_launcher.py::test_start", ["clean", "slurm"], None, "SLURM"),
    ("tests/test_slurm_units.py::test_script", [], "slurm", "SLURM"),
    ("tests/test_remote_twohosts.py::test_join", ["two_hosts"], None, "two-host"),
    ("tests/test_cluster_run.py::test_values", ["cluster2"], None, "unit"),
])
def test_each_test_is_counted_under_the_component_it_starts(nodeid, fixtures, marker, kind):
    assert kind_of(item(nodeid, fixtures, marker)) == kind


def test_the_rows_add_up_by_kind_and_file_and_rank_the_slowest_first():
    table = TimeTable()
    table.tests = {"tests/a.py::x": ("unit", 1.0), "tests/a.py::y": ("unit", 2.0),
                   "tests/browser/b.py::z": ("browser", 5.0), "notebooks/n.ipynb::Cell 0": ("notebooks", 4.0)}
    kinds, files, tests = table.rows()
    assert kinds == [("browser", 1, 5.0), ("notebooks", 1, 4.0), ("unit", 2, 3.0)]
    assert files == [("tests/browser/b.py", 5.0), ("notebooks/n.ipynb", 4.0), ("tests/a.py", 3.0)]
    assert [name for name, _ in tests] == ["tests/browser/b.py::z", "notebooks/n.ipynb::Cell 0",
                                           "tests/a.py::y", "tests/a.py::x"]


def report(nodeid, duration, kind, worker=None):
    node = SimpleNamespace(gateway=SimpleNamespace(id=worker)) if worker else None
    return SimpleNamespace(nodeid=nodeid, duration=duration, user_properties=[("kind", kind)], node=node)


def test_each_phase_adds_to_its_test_and_to_the_worker_that_ran_it():
    """Under xdist the table is made from the reports that reach the controller: setup, call and teardown of a
    test add up, under the kind its worker gave it, and each worker's busy time is kept."""
    table = TimeTable()
    for phase_seconds, worker in ((2.0, "gw0"), (0.5, "gw0"), (0.25, "gw0")):
        table.pytest_runtest_logreport(report("tests/a.py::x", phase_seconds, "SLURM", worker))
    table.pytest_runtest_logreport(report("notebooks/n.ipynb::Cell 0", 4.0, "notebooks", "gw1"))
    table.pytest_runtest_logreport(report("tests/b.py::y", 1.0, "unit"))  # no xdist: the one pytest
    assert table.tests == {"tests/a.py::x": ("SLURM", 2.75), "notebooks/n.ipynb::Cell 0": ("notebooks", 4.0),
                           "tests/b.py::y": ("unit", 1.0)}
    assert dict(table.workers) == {"gw0": 2.75, "gw1": 4.0, "pytest": 1.0}
