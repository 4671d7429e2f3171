"""The ZeRO and tensor-parallel explorers follow their controls and draw what the formulas say."""

from __future__ import annotations

import pytest

from ppkit.lessons import sharding_plots, zero
from ppkit.lessons import tensor_parallel as tp
from ppkit.widgets import TensorParallelExplorer, ZeroExplorer


def test_zero_explorer_follows_its_controls():
    ex = ZeroExplorer(world_size=4, stage=1, params=7_000_000_000)
    assert "ZeRO-1, 4 ranks, 7,000,000,000 parameters" in ex.summary.value
    assert "holds 70 GB (params 28 GB, grads 28 GB, optimizer 14 GB) and sends 42 GB per step" in ex.summary.value
    first, count = ex.figure, ex.redraws
    ex.stage.value = 3
    ex.world_size.value = 8
    assert ex.redraws == count + 2 and ex.figure is not first
    assert "ZeRO-3 / FSDP, 8 ranks" in ex.summary.value and "holds 14 GB" in ex.summary.value
    ex.params.value = 131
    assert "131 parameters" in ex.summary.value
    bars = [p.get_height() for p in ex.figure.axes[1].patches]  # traffic per stage, in the figure's unit
    assert bars[3] == pytest.approx(1.5 * bars[0])


def test_zero_explorer_classes_for_the_browser_test():
    ex = ZeroExplorer()
    for name, w in {"world-size": ex.world_size, "stage": ex.stage, "params": ex.params,
                    "summary": ex.summary, "output": ex.output}.items():
        assert f"ppkit-zero-{name}" in w._dom_classes
    assert "ppkit-zero" in ex.widget._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in ex._repr_mimebundle_()


def test_tp_explorer_follows_its_controls():
    ex = TensorParallelExplorer(degree=2, d_model=4096, tokens=8192)
    assert "TP degree 2, MLP 4096 -> 16384 -> 4096, 8,192 tokens" in ex.summary.value
    count = ex.redraws
    ex.degree.value = 8
    assert ex.redraws == count + 1 and "TP degree 8" in ex.summary.value
    assert "sends 470 MB" in ex.summary.value  # 2 all_reduces x 2*7/8 x 8192*4096*4 bytes
    assert "ppkit-tp-degree" in ex.degree._dom_classes and "ppkit-tp" in ex.widget._dom_classes


def test_measured_dots_are_drawn_where_given():
    runs = {s: {"held": zero.memory_formula(131, 4, s), "sent_bytes": zero.comm_formula(131, 4, s)}
            for s in zero.STAGES}
    fig = sharding_plots.plot_zero(131, 4, measured=runs)
    assert len(fig.axes[0].lines) == 4 and len(fig.axes[1].lines) == 4
    fig = sharding_plots.plot_tensor_parallel(4, 8, 32, 6, measured={4: {"weights": 576, "sent": 576}})
    assert [line.get_ydata()[0] for line in fig.axes[0].lines] == [pytest.approx(0.576)]
    assert fig.axes[0].get_ylabel() == "KB"
    assert tp.mlp_memory_formula(4)["weights"] == 576


def test_human_bytes():
    assert sharding_plots.human_bytes(512) == "512 B"
    assert sharding_plots.human_bytes(70e9) == "70 GB"
