"""The measured ring: spans and work per rank come back, the compute-only run sends nothing, a sub-ring
of the first k ranks works, and impossible settings are refused in the kernel before anything runs."""

from __future__ import annotations

import pytest

from ppkit.errors import ConfigError
from ppkit.lessons import context_timing as ct


def test_a_measured_step_has_compute_and_waits_per_rank(cluster2):
    m = ct.measure(cluster2, seq_len=256, sharding="contiguous", causal=True, heads=2, head_dim=16, repeats=2)
    assert m.layout.world_size == 2 and len(m.spans) == 2 and len(m.steps) == 2
    for rank, spans in enumerate(m.spans):
        labels = [s["label"] for s in spans if s["kind"] == "compute"]
        assert labels == ["f0", "f1", "b0", "b1"], labels
        assert {s["phase"] for s in spans} == {"forward", "backward"} and {s["rank"] for s in spans} == {rank}
    assert all(c > 0 for c in m.compute_s) and m.step_s >= max(m.steps) > 0
    assert m.counted == [128 * 128, 2 * 128 * 128]
    assert m.imbalance >= 1 and "contiguous, causal, 256 tokens over 2 ranks: step" in m.summary()


def test_compute_only_waits_for_nothing(cluster2):
    m = ct.measure(cluster2, seq_len=128, causal=False, heads=2, head_dim=8, comm=False)
    assert "compute only" in m.title() and max(m.wait_s) < 0.05


def test_a_sub_ring_of_the_first_ranks(cluster4):
    for ranks in (2, 3, 4, 2):
        m = ct.measure(cluster4, seq_len=96, ranks=ranks, sharding="zigzag", heads=1, head_dim=8)
        assert len(m.spans) == ranks and m.layout.world_size == ranks


@pytest.mark.parametrize("options, says", [
    ({"seq_len": 100, "ranks": 3}, "sequence length 100 cannot be cut into 2 x 3 = 6 equal chunks"),
    ({"ranks": 5}, "ranks=5: the cluster has 4 ranks, so the ring can use 1 to 4 of them"),
    ({"ranks": 0}, "ranks=0: the cluster has 4 ranks"),
    ({"sharding": "zig-zag"}, "sharding 'zig-zag' is not one of contiguous, zigzag"),
    ({"heads": 0}, "heads must be a whole number of at least 1, got 0"),
])
def test_impossible_settings_are_refused_before_running(cluster4, options, says, monkeypatch):
    ran = []
    monkeypatch.setattr(cluster4, "run", lambda *a, **k: ran.append(a))
    with pytest.raises(ConfigError) as info:
        ct.measure(cluster4, **options)
    assert says in str(info.value) and ran == []


def test_pictures():
    m = ct.Measurement(ct.check_settings(16, 2, "zigzag", 2), True, True,
                       [[{"rank": r, "label": "f0", "kind": "compute", "peer": None, "phase": "forward",
                          "start": 0.0, "end": 0.1}] for r in range(2)],
                       [{"forward": 0.1, "backward": 0.2}] * 2, [0.3, 0.3])
    assert m.imbalance == 1.0
    assert ct.plot_timeline(m).axes[0].get_title() == "zigzag, causal, 16 tokens over 2 ranks"
    fig = ct.plot_work(m, m)
    assert len(fig.axes[0].patches) == 4 and fig.axes[1].get_ylabel() == "CPU ms"
