"""tests/markers.py: every test gets the kinds of what it starts, so `-m` picks by kind (make test-fast is one)."""

from __future__ import annotations

import markers
import pytest


class Item:  # what kinds_of reads of a pytest item: its id, its function and the fixtures it uses
    def __init__(self, nodeid: str, function=None, fixtures=()):
        self.nodeid, self.function = nodeid, function
        self._fixtureinfo = type("Info", (), {"name2fixturedefs": {
            f.__name__: [type("Def", (), {"func": f})] for f in fixtures}})


def starts_two_ranks():
    import ppkit
    with ppkit.Cluster(2) as cluster:
        cluster.run(print)


def reads_a_kernel(live_kernel):
    return live_kernel


def runs_torchft_replicas():
    from ppkit.lessons.fault_tolerance import Lighthouse, run_replicas
    with Lighthouse() as lighthouse:
        run_replicas(2, steps=4, lighthouse=lighthouse)


def refuses_torchft_arguments():
    from ppkit.lessons.fault_tolerance import run_replicas
    run_replicas(**{"num_replicas": 0})


def adds():
    assert 1 + 1 == 2


@pytest.mark.parametrize("nodeid, timing_kind, function, fixtures, want", [
    ("notebooks/00_start_here.ipynb::Cell 0", "notebooks", None, (), {"notebook", "kernel", "cluster"}),
    ("tests/browser/test_widgets_in_lab.py::test_x", "browser", adds, (), {"browser"}),
    ("tests/test_slurm_launcher.py::test_x", "SLURM", adds, (), {"slurm"}),
    ("tests/test_remote_twohosts.py::test_x", "two-host", adds, (), {"netns"}),
    ("tests/test_x.py::test_x", "unit", starts_two_ranks, (), {"cluster"}),
    ("tests/test_x.py::test_x", "unit", adds, (starts_two_ranks,), {"cluster"}),  # through a fixture
    ("tests/test_x.py::test_x", "unit", reads_a_kernel, (), {"kernel"}),
    ("tests/test_x.py::test_x", "unit", runs_torchft_replicas, (), {"cluster"}),  # torchft's replica processes
    ("tests/test_x.py::test_x", "unit", refuses_torchft_arguments, (), {"unit"}),  # a ConfigError starts nothing
    ("tests/test_course_wheel.py::test_x", "unit", adds, (), {"packaging"}),
    ("tests/test_x.py::test_x", "unit", adds, (), {"unit"}),
])
def test_each_test_gets_the_kinds_of_what_it_starts(nodeid, timing_kind, function, fixtures, want):
    assert set(markers.kinds_of(Item(nodeid, function, fixtures), timing_kind)) == want


def test_every_kind_is_registered_so_that_strict_markers_would_pass():
    lines = []

    class Config:
        def addinivalue_line(self, name, line):
            lines.append((name, line.split(":", 1)[0]))

    markers.register(Config())
    assert {kind for _, kind in lines} == set(markers.KINDS)
