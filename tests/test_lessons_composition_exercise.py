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
    """Trusts the formula (model state + activations), which spreads the parameters evenly over pp x tp."""
    for mesh in sorted(meshes, key=lambda m: (-m[0], m[2])):
        if mc.total_formula(mesh, shard_dp=False) <= budget:
            return mesh
    return None


def most_tp(meshes, budget, memory_of):
    for mesh in sorted(meshes, key=lambda m: (-m[0], -m[2])):
        if memory_of(mesh) <= budget:
            return mesh
    return None


def never_none(meshes, budget, memory_of):
    return min(meshes, key=memory_of)


def _follows_the_rule(answer, budget, measured) -> bool:
    """The answer fits, and no mesh with more dp, or as much dp and less tp, does; None: none fits."""
    fits = [mesh for mesh, used in measured.items() if used <= budget]
    if answer is None:
        return not fits
    return answer in fits and not any(m[0] > answer[0] or (m[0] == answer[0] and m[2] < answer[2]) for m in fits)


@pytest.mark.slow
def test_the_solution_passes_and_wrong_answers_are_named(cluster8):
    report = check_composition.check_choose_mesh(solutions.choose_mesh, cluster=cluster8)
    assert report.passed and len(report.cases) == 4
    measured = check_composition._MEASURED
    assert set(measured) == set(comp.shapes(8))  # the 90,000 case measures every mesh
    answers = {budget: solutions.choose_mesh(comp.shapes(8), budget, measured.__getitem__)
               for _, budget in check_composition.BUDGETS}
    assert all(_follows_the_rule(answers[b], b, measured) for b in answers)
    assert len(set(answers.values())) == 4 and None in answers.values()  # four different answers
    # what memory_of returns: model state + activations of the busiest rank, measured
    m = mc.measure(cluster8, (2, 4, 1), shard_dp=False)
    assert measured[2, 4, 1] == max(m.memory()) > max(r.held["params"] * 4 for r in m.ranks)

    # a budget where the formula says a mesh fits and measured it does not: that is where by_formula is caught
    traps = [(label, budget, by_formula(comp.shapes(8), budget, None)) for label, budget in
             check_composition.BUDGETS if by_formula(comp.shapes(8), budget, None) != answers[budget]]
    assert traps
    label, budget, got = traps[0]
    assert mc.total_formula(got, shard_dp=False) <= budget < measured[got]
    with pytest.raises(ExerciseFailed, match=rf"budget {label}: {'x'.join(map(str, got))} does not fit: its busiest "
                                             rf"rank measured {measured[got]:,} bytes > {budget:,} \(the formula "
                                             rf"says {mc.total_formula(got, shard_dp=False):,.0f}"):
        check_composition.check_choose_mesh(by_formula, cluster=cluster8)
    # a budget where two meshes of the same dp fit: most_tp picks the one with more tp
    ties = [(label, budget) for label, budget in check_composition.BUDGETS
            if most_tp(comp.shapes(8), budget, measured.__getitem__) != answers[budget]]
    assert ties
    label, budget = ties[0]
    got, want = most_tp(comp.shapes(8), budget, measured.__getitem__), answers[budget]
    with pytest.raises(ExerciseFailed, match=rf"budget {label}: {'x'.join(map(str, got))} fits "
                                             rf"\({measured[got]:,} bytes\), but {'x'.join(map(str, want))} fits "
                                             rf"too \({measured[want]:,}\) with as much dp and less tensor "
                                             "parallelism"):
        check_composition.check_choose_mesh(most_tp, cluster=cluster8)
    with pytest.raises(ExerciseFailed, match=r"does not fit.*no mesh fits here: return None"):
        check_composition.check_choose_mesh(never_none, cluster=cluster8)
    with pytest.raises(ExerciseFailed, match=r"returned '2x2x2'; return one of the meshes given"):
        check_composition.check_choose_mesh(lambda meshes, budget, memory_of: "2x2x2", cluster=cluster8)
    assert cluster8.state == "ready"


def test_a_cluster_of_another_size_is_refused(cluster8):
    class Four:
        world_size = 4
    with pytest.raises(ConfigError, match="the check runs on 8 ranks, but this cluster has 4"):
        check_composition.check_choose_mesh(solutions.choose_mesh, cluster=Four())
