"""The measured MoE layer: tokens per expert and rank add up, drops are counted, the bytes sent equal the
counted pairs' rows, a sub-group of the first ranks works, and impossible settings are refused in the
kernel before anything runs."""

from __future__ import annotations

import pytest

from ppkit.errors import ConfigError
from ppkit.lessons import moe_timing as mt

SMALL = {"tokens": 128, "hidden": 16, "ffn": 32}


def test_a_measured_step_adds_up(cluster4):
    m = mt.measure(cluster4, experts=8, top_k=2, capacity_factor=1.0, skew=1.0, repeats=2, **SMALL)
    assert m.ranks == 4 and len(m.rows) == len(m.phases) == len(m.steps) == 4
    pairs = 4 * 128 * 2
    assert sum(m.chosen_per_expert) == pairs and sum(m.kept_per_expert) == pairs - m.dropped_pairs
    assert sum(m.rows) == sum(m.kept_per_expert) and m.dropped_pairs > 0
    assert max(m.kept_per_expert) <= 4 * m.settings.capacity()
    assert m.sent_bytes == m.counted_bytes == sum(m.kept_per_expert) * 16 * 4 * 4
    assert 0 < m.off_rank_bytes < m.sent_bytes < m.padded_bytes
    assert m.count_bytes == [8 * 8] * 4  # 8 experts x an int64 count, handed over once
    assert set(m.phases[0]) == set(mt.PHASES) and m.step_s >= max(sum(p.values()) for p in m.phases) * 0.5
    assert m.imbalance >= 1 and "dropped" in m.summary() and "8 experts over 4 ranks, top-2" in m.title()


def test_no_drops_with_room_for_everything(cluster2):
    m = mt.measure(cluster2, experts=4, top_k=2, capacity_factor=2.0, skew=3.0, **SMALL)
    assert m.dropped_pairs == m.dropped_tokens == 0 and m.ranks == 2
    assert m.rows[0] > m.rows[1]  # the skew favours experts 0 and 1, both on rank 0


def test_a_group_of_the_first_ranks(cluster4):
    for ranks in (1, 2, 4, 2):
        m = mt.measure(cluster4, experts=4, ranks=ranks, **SMALL)
        assert m.ranks == ranks and len(m.rows) == ranks
        assert m.sent_bytes == m.counted_bytes


@pytest.mark.parametrize("options, says", [
    ({"top_k": 9}, "top_k=9: each token picks top_k different experts out of 8, so top_k must be a whole number "
                   "from 1 to 8."),
    ({"capacity_factor": 0.0}, "capacity_factor=0.0: it must be a finite number above 0"),
    ({"experts": 6}, "6 experts cannot be spread evenly over 4 ranks; pick a number of experts that is a multiple "
                     "of 4 (such as 4 or 8), or a number of ranks that divides 6 (1, 2, 3, 6)."),
    ({"ranks": 5}, "ranks=5: the cluster has 4 ranks, so the experts can be spread over 1 to 4 of them"),
    ({"ranks": 0}, "ranks=0: the cluster has 4 ranks"),
    ({"skew": float("nan")}, "skew=nan: it must be a finite number"),
    ({"repeats": 0}, "repeats must be a whole number of at least 1, got 0"),
])
def test_impossible_settings_are_refused_before_running(cluster4, options, says, monkeypatch):
    ran = []
    monkeypatch.setattr(cluster4, "run", lambda *a, **k: ran.append(a))
    with pytest.raises(ConfigError) as info:
        mt.measure(cluster4, **options)
    assert says in str(info.value) and ran == []


def test_picture():
    s, _ = mt.check_settings(2, 2, experts=4, top_k=1)
    phases = [dict.fromkeys(mt.PHASES, 0.01) for _ in range(2)]
    m = mt.Measurement(s, 2, [[10, 6, 8, 8], [9, 7, 8, 8]], [[8, 6, 8, 8], [8, 7, 8, 8]], [29, 32], [(2, 1), (1, 0)],
                       [1.0, 1.0], [(100, 50), (100, 50)], [32, 32], phases, [0.1, 0.12])
    assert m.kept_per_expert == [16, 13, 16, 16] and m.dropped_pairs == 3 and m.step_s == 0.12
    fig = mt.plot(m)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["(token, choice) pairs per expert",
                                                        "rows computed per rank (busiest / mean 1.05)"]
    assert fig.axes[2].get_title() == "time per rank: step 120 ms (forward + backward)"
