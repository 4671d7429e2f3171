"""The mesh explorer measures the mesh its controls say, redraws for a budget without running, and refuses a
mesh the world or the model cannot take without running anything or breaking the cluster."""

from __future__ import annotations

import pytest

import ppkit
from ppkit.errors import ConfigError
from ppkit.widgets import MeshExplorer

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster8():
    with ppkit.Cluster(8, "gloo", timeout=300) as cluster:
        yield cluster


@pytest.mark.slow
def test_explorer_measures_refuses_and_keeps_the_cluster(cluster8):
    ex = MeshExplorer(cluster8, mesh=(2, 2, 2), budget=90_000)
    assert ex.redraws == 1 and ex.error is None and ex.measurement.mesh == (2, 2, 2)
    assert "2x2x2 (dp shards: FSDP2)" in ex.summary.value and "equal" in ex.summary.value
    assert "NOT equal" not in ex.summary.value and "fits in 90,000" in ex.summary.value
    # the budget is held against model state + activations, both measured and shown
    acts = max(ex.measurement.activations())
    assert acts > 0 and f"Activations kept (most on one rank): {acts:,} bytes measured" in ex.summary.value
    state = max(ex.measurement.model_state())
    ex.budget.value = state + 2_000 - state % 2_000  # the model state alone fits; with the activations it does not
    assert ex.redraws == 2 and "does not fit" in ex.summary.value
    ex.dims["tp"].value = 4  # 2x2x4: 16 ranks
    assert ex.error.startswith("mesh 2x2x4 has 16 ranks, but the world has 8")
    assert "Not run" in ex.summary.value and "1x2x4, 1x4x2, 2x1x4, 2x2x2, 2x4x1, 4x1x2, 4x2x1" in ex.summary.value
    assert ex.measurement.mesh == (2, 2, 2) and ex.redraws == 2 and cluster8.state == "ready"
    ex.dims["dp"].value = 1  # 1x2x4: runs on the same cluster
    assert ex.error is None and ex.measurement.mesh == (1, 2, 4) and ex.redraws == 3
    assert "1x2x4" in ex.summary.value and "not measured yet" in ex.summary.value
    ex.world.value = 4  # 1x2x4 on a world of 4: refused
    assert ex.error.startswith("mesh 1x2x4 has 8 ranks, but the world has 4")
    assert "that work for 4 ranks: 1x1x4, 1x2x2, 1x4x1, 2x1x2, 2x2x1" in ex.error
    ex.dims["tp"].value = 2  # 1x2x2: ranks 0-3 run it, 4-7 wait
    assert ex.error is None and ex.measurement.mesh == (1, 2, 2) and len(ex.measurement.ranks) == 4
    assert "on 4 ranks" in ex.summary.value and ex.measurement.equal and cluster8.state == "ready"


def test_a_bad_starting_mesh_is_refused_before_drawing(cluster8):
    with pytest.raises(ConfigError, match="world size 64: .* which has 8; pick a whole number from 1 to 8"):
        MeshExplorer(cluster8, mesh=(4, 4, 4))
    with pytest.raises(ConfigError, match="tp=8 cannot split 4 heads .* that work for 8 ranks: 1x2x4"):
        MeshExplorer(cluster8, mesh=(1, 1, 8))
    assert cluster8.state == "ready"
