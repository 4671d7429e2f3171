"""How the suite is shared between xdist's workers (tests/scheduling.py)."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
from scheduling import BROWSER, SLURM, check_scopes, make_scheduler, scope_of
from timing import kind_of

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


def test_the_component_groups_are_handed_out_first_then_xdists_order(pytestconfig, monkeypatch):
    pytest.importorskip("xdist")
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])  # as `-n 2` sets it
    sched = make_scheduler(pytestconfig, None)
    sent = []

    class Node:  # the part of xdist's WorkerController the scheduler uses here
        send_runtest_some = staticmethod(sent.append)

    node = Node()
    collection = ["tests/a.py::t", "tests/test_slurm_launcher.py::t", "tests/browser/test_b.py::t"]
    sched.registered_collections = {node: collection}
    sched.workqueue = OrderedDict((scope_of(n, ROOT), {n: False}) for n in collection)
    for _ in collection:
        sched._assign_work_unit(node)
    assert sent == [[2], [1], [0]]  # the browser group, the SLURM group, then the rest
