"""The MoE explorer measures what its controls say, and refuses impossible settings without running
anything or breaking the cluster."""

from __future__ import annotations

import pytest

from ppkit.errors import ConfigError
from ppkit.widgets import MoEExplorer

SMALL = {"tokens": 128, "hidden": 16, "ffn": 32}


def test_explorer_measures_what_its_controls_say(cluster4):
    ex = MoEExplorer(cluster4, **SMALL)
    assert "8 experts over 4 ranks, top-2, capacity factor 1.25, skew 0" in ex.summary.value and ex.redraws == 1
    assert ex.measurement.ranks == 4 and ex.figure is not None and ex.error is None
    assert [f"rank {r}</td>" in ex.summary.value for r in range(5)] == [True] * 4 + [False]
    assert "equal to the counted" in ex.summary.value and "NOT equal" not in ex.summary.value
    first = ex.figure
    ex.skew.value = 3.0
    ex.capacity.value = 0.5
    assert ex.redraws == 3 and ex.figure is not first
    assert "capacity factor 0.5, skew 3" in ex.summary.value and ex.measurement.dropped_pairs > 0
    ex.ranks.value = 2
    ex.top_k.value = 1
    assert "8 experts over 2 ranks, top-1" in ex.summary.value
    assert ex.measurement.settings.experts_per_rank(2) == 4


@pytest.mark.parametrize("before, change, says", [
    ({"ranks": 2, "experts": 2}, ("top_k", 3), "top_k=3: each token picks top_k different experts out of 2, so "
                                               "top_k must be a whole number from 1 to 2."),
    ({}, ("capacity", 0.0), "capacity_factor=0.0: it must be a finite number above 0"),
    ({}, ("experts", 6), "6 experts cannot be spread evenly over 4 ranks; pick a number of experts that is a "
                         "multiple of 4 (such as 4 or 8), or a number of ranks that divides 6 (1, 2, 3, 6)."),
])
def test_impossible_settings_are_refused_and_the_cluster_stays_usable(cluster4, before, change, says):
    ex = MoEExplorer(cluster4, **SMALL)
    for name, value in before.items():
        getattr(ex, name).value = value
    count, figure = ex.redraws, ex.figure
    getattr(ex, change[0]).value = change[1]
    assert ex.redraws == count and ex.figure is figure
    assert "Not run:" in ex.summary.value and says in ex.error
    assert cluster4.state == "ready"
    ex.ranks.value, ex.experts.value, ex.top_k.value, ex.capacity.value = 4, 4, 1, 1.0
    assert ex.error is None and ex.redraws > count and "4 experts over 4 ranks, top-1" in ex.summary.value


def test_constructor_refuses_before_drawing(cluster4):
    with pytest.raises(ConfigError, match="ranks=8: the cluster has 4 ranks"):
        MoEExplorer(cluster4, ranks=8)
    with pytest.raises(ConfigError, match="top_k=9: each token picks top_k different experts out of 8"):
        MoEExplorer(cluster4, top_k=9)
    with pytest.raises(ConfigError, match="capacity_factor=-1: it must be a finite number above 0"):
        MoEExplorer(cluster4, capacity_factor=-1)


def test_classes_for_the_browser_test(cluster4):
    ex = MoEExplorer(cluster4, ranks=2, experts=2, top_k=1, **SMALL)
    for name, w in {"experts": ex.experts, "ranks": ex.ranks, "top-k": ex.top_k, "capacity": ex.capacity,
                    "skew": ex.skew, "summary": ex.summary, "output": ex.output}.items():
        assert f"ppkit-moe-{name}" in w._dom_classes
    assert "ppkit-moe" in ex.widget._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in ex._repr_mimebundle_()


def test_a_run_that_fails_says_so_and_how_to_recover(monkeypatch):
    from types import SimpleNamespace

    from ppkit.errors import WorkerDiedError
    from ppkit.lessons import moe_timing

    def dies(*args, **kwargs):
        raise WorkerDiedError("rank 1 died (SIGKILL)", [1])

    monkeypatch.setattr(moe_timing, "measure", dies)
    ex = MoEExplorer(SimpleNamespace(world_size=2, state="broken"))
    assert ex.redraws == 0 and ex.measurement is None and ex.error == "rank 1 died (SIGKILL)"
    assert ("Not run:</b> rank 1 died (SIGKILL) The cluster is broken now: run cluster.restart(), then change "
            "a setting.") in ex.summary.value


def test_a_change_from_another_thread_waits_for_the_running_measurement(monkeypatch):
    """JupyterLab can deliver a widget change on a kernel subshell (another thread) while a measurement runs:
    it must not start a second cluster.run at once, and the latest settings are measured right after."""
    import threading
    from types import SimpleNamespace

    from ppkit.lessons import moe_timing

    measured, running = [], []

    def measure(cluster, ranks, **options):
        assert not running, "two measurements at once"
        running.append(True)
        try:
            measured.append(options["skew"])
            if len(measured) == 2:  # a change arrives from another thread while this one runs
                change = threading.Thread(target=setattr, args=(ex.skew, "value", 3.0))
                change.start()
                change.join()
            s, _ = moe_timing.check_settings(4, ranks, **options)
            phases = [dict.fromkeys(moe_timing.PHASES, 0.01)] * 4
            return moe_timing.Measurement(s, 4, [[1] * 8] * 4, [[1] * 8] * 4, [2] * 4, [(0, 0)] * 4, [1.0] * 4,
                                          [(10, 5)] * 4, [64] * 4, phases, [0.1] * 4)
        finally:
            running.pop()

    monkeypatch.setattr(moe_timing, "measure", measure)
    ex = MoEExplorer(SimpleNamespace(world_size=4, state="ready"), **SMALL)
    ex.skew.value = 1.0
    assert measured == [0.0, 1.0, 3.0] and ex.redraws == 3
    assert ex.measurement.settings.skew == 3.0 and "skew 3" in ex.summary.value
