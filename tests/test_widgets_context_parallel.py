"""The ring attention explorer measures what its controls say, and refuses impossible settings without
running anything or breaking the cluster."""

from __future__ import annotations

import pytest

from ppkit.errors import ConfigError
from ppkit.widgets import RingAttentionExplorer


def test_explorer_measures_what_its_controls_say(cluster4):
    ex = RingAttentionExplorer(cluster4, seq_len=768, heads=2, head_dim=16)
    assert "zigzag, causal, 768 tokens over 4 ranks" in ex.summary.value and ex.redraws == 1
    assert ex.measurement.layout.world_size == 4 and ex.figure is not None and ex.error is None
    assert [f"rank {r}</td>" in ex.summary.value for r in range(5)] == [True] * 4 + [False]
    first = ex.figure
    ex.sharding.value = "contiguous"
    ex.ranks.value = 2
    assert ex.redraws == 3 and ex.figure is not first
    assert "contiguous, causal, 768 tokens over 2 ranks" in ex.summary.value
    assert ex.measurement.counted == [384 * 384, 2 * 384 * 384]
    ex.causal.value = False
    assert "contiguous, no mask, 768 tokens over 2 ranks" in ex.summary.value


def test_impossible_settings_are_refused_and_the_cluster_stays_usable(cluster4):
    ex = RingAttentionExplorer(cluster4, seq_len=1024, ranks=2, heads=1, head_dim=8)
    count, figure = ex.redraws, ex.figure
    ex.ranks.value = 3  # 1024 tokens cannot be cut in 6 chunks
    assert ex.redraws == count and ex.figure is figure
    assert "Not run:" in ex.summary.value
    assert ("sequence length 1024 cannot be cut into 2 x 3 = 6 equal chunks, which zig-zag sharding over 3 ranks "
            "needs; pick a multiple of 6 such as 1020 or 1026") in ex.error
    assert cluster4.state == "ready"
    ex.seq_len.value = 1536  # 6 x 256: the ring runs again
    assert ex.error is None and ex.redraws == count + 1 and "1536 tokens over 3 ranks" in ex.summary.value


def test_constructor_refuses_before_drawing(cluster4):
    with pytest.raises(ConfigError, match="ranks=8: the cluster has 4 ranks"):
        RingAttentionExplorer(cluster4, ranks=8)
    with pytest.raises(ConfigError, match="sequence length 100 cannot be cut"):
        RingAttentionExplorer(cluster4, seq_len=100)


def test_classes_for_the_browser_test(cluster4):
    ex = RingAttentionExplorer(cluster4, seq_len=256, ranks=2, heads=1, head_dim=8)
    for name, w in {"seq-len": ex.seq_len, "ranks": ex.ranks, "sharding": ex.sharding, "causal": ex.causal,
                    "summary": ex.summary, "output": ex.output}.items():
        assert f"ppkit-cp-{name}" in w._dom_classes
    assert "ppkit-cp" in ex.widget._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in ex._repr_mimebundle_()


def test_a_run_that_fails_says_so_and_how_to_recover(monkeypatch):
    from types import SimpleNamespace

    from ppkit.errors import WorkerDiedError
    from ppkit.lessons import context_timing

    def dies(*args, **kwargs):
        raise WorkerDiedError("rank 1 died (SIGKILL)", [1])

    monkeypatch.setattr(context_timing, "measure", dies)
    ex = RingAttentionExplorer(SimpleNamespace(world_size=2, state="broken"), seq_len=256)
    assert ex.redraws == 0 and ex.measurement is None and ex.error == "rank 1 died (SIGKILL)"
    assert ("Not run:</b> rank 1 died (SIGKILL) The cluster is broken now: run cluster.restart(), then change "
            "a setting.") in ex.summary.value
