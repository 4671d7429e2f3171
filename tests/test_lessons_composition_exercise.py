"""The choose_mesh checker measures the answer on 8 ranks and says what is wrong with a wrong one."""

from __future__ import annotations

import pytest

import ppkit
from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import check_composition, solutions
from ppkit.lessons import composition as comp
from ppkit.lessons import mesh_costs as mc

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def cluster8():
    with ppkit.Cluster(8, "gloo", timeout=300) as cluster:
        yield cluster


def by_formula(meshes, budget, memory_of):
    """Trusts the formula, which leaves out what tp keeps whole: wrong at 60,000 bytes."""
    for mesh in sorted(meshes, key=lambda m: (-m[0], m[2])):
        if mc.memory_formula(mesh, shard_dp=False) <= budget:
            return mesh
    return None


def most_tp(meshes, budget, memory_of):
    for mesh in sorted(meshes, key=lambda m: (-m[0], -m[2])):
        if memory_of(mesh) <= budget:
            return mesh
    return None


def never_none(meshes, budget, memory_of):
    return min(meshes, key=memory_of)


@pytest.mark.slow
def test_the_solution_passes_and_wrong_answers_are_named(cluster8):
    report = check_composition.check_choose_mesh(solutions.choose_mesh, cluster=cluster8)
    assert report.passed and len(report.cases) == 4
    answers = {budget: solutions.choose_mesh(comp.shapes(8), budget, check_composition._MEASURED.__getitem__)
               for _, budget in check_composition.BUDGETS}
    assert answers == {10 ** 9: (4, 2, 1), 70_000: (2, 4, 1), 60_000: (1, 4, 2), 30_000: None}

    with pytest.raises(ExerciseFailed, match=r"budget 60,000 bytes: 2x4x1 does not fit: its busiest rank measured "
                                             r"61,696 bytes > 60,000 \(the formula says 56,832"):
        check_composition.check_choose_mesh(by_formula, cluster=cluster8)
    with pytest.raises(ExerciseFailed, match=r"budget 70,000 bytes: 2x2x2 fits \(63,232 bytes\), but 2x4x1 fits "
                                             r"too \(61,696\) with as much dp and less tensor parallelism"):
        check_composition.check_choose_mesh(most_tp, cluster=cluster8)
    with pytest.raises(ExerciseFailed, match=r"budget 30,000 bytes: 1x4x2 does not fit.*no mesh fits here: "
                                             r"return None"):
        check_composition.check_choose_mesh(never_none, cluster=cluster8)
    with pytest.raises(ExerciseFailed, match=r"returned '2x2x2'; return one of the meshes given"):
        check_composition.check_choose_mesh(lambda meshes, budget, memory_of: "2x2x2", cluster=cluster8)
    assert cluster8.state == "ready"


def test_a_cluster_of_another_size_is_refused(cluster8):
    class Four:
        world_size = 4
    with pytest.raises(ConfigError, match="the check runs on 8 ranks, but this cluster has 4"):
        check_composition.check_choose_mesh(solutions.choose_mesh, cluster=Four())
