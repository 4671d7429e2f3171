"""Lesson 2: every collective on real gloo ranks equals the plain-Python model; the seed's claims."""

from __future__ import annotations

import pytest

from ppkit.errors import ConfigError
from ppkit.lessons import collectives as C
from ppkit.lessons import seed001, timeline


def all_cases():
    return [(op, kind, rop, numel)
            for op in C.OPS for kind in C.KINDS
            for rop in (C.REDUCE_OPS if op in C.REDUCING else ("sum",))
            for numel in (1, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("world", ["cluster2", "cluster4"])
def test_every_collective_matches_the_model(world, request):
    cluster = request.getfixturevalue(world)
    if cluster.state == "broken":
        cluster.restart()
    cases = all_cases()
    results = cluster.run(C.run_many, cases)
    n = cluster.world_size
    problems = []
    for i, (op, kind, rop, numel) in enumerate(cases):
        real = [results[r][i] for r in range(n)]
        assert [s["before"] for s in real] == [s["before"] for s in C.reference(op, n, kind, rop, numel)]
        problems += C.compare(real, C.reference(op, n, kind, rop, numel))
    assert problems == []


# the article's stated results, with 4 ranks
SEED_CLAIMS = {
    "broadcast": [[2.0]] * 4,
    "scatter": [[1.0], [2.0], [3.0], [4.0]],
    "reduce": [[4.0], None, None, None],
    "all_reduce": [[4.0]] * 4,
    "gather": [[1.0] * 4, None, None, None],
    "all_gather": [[1.0] * 4] * 4,
}


@pytest.mark.parametrize("op", sorted(SEED_CLAIMS))
def test_seed_claims_with_four_ranks(cluster4, op):
    if cluster4.state == "broken":
        cluster4.restart()
    states = cluster4.run(C.run_collective, op)
    assert C.after_values(states) == SEED_CLAIMS[op]
    assert C.after_values(C.reference(op, 4)) == SEED_CLAIMS[op]


def test_seed_collective_functions_run_unchanged(cluster4, capsys):
    if cluster4.state == "broken":
        cluster4.restart()
    for fn in (seed001.test_broadcast, seed001.test_scatter, seed001.test_reduce, seed001.test_all_reduce,
               seed001.test_gather, seed001.test_all_gather):
        assert cluster4.run(fn) == [None] * 4
    out = capsys.readouterr().out
    for r in range(4):
        assert f"[rank {r}] Rank  {r}  has data  tensor([4.])" in out  # all_reduce
        assert f"[rank {r}] Rank  {r}  has data  tensor([{r + 1}.])" in out  # scatter
        assert f"[rank {r}] Rank  {r}  has data  [tensor([1.]), tensor([1.]), tensor([1.]), tensor([1.])]" in out
    assert "[rank 0] Rank  0  has data  tensor([2.])" in out  # broadcast


def test_reduce_leaves_other_ranks_undefined_and_says_so(cluster4):
    states = cluster4.run(C.run_collective, "reduce", "distinct")
    assert states[0]["after"] == [60.0] and states[0]["defined"]
    assert [s["defined"] for s in states[1:]] == [False] * 3
    fig = C.plot_states(states, "reduce")
    texts = [t.get_text() for t in fig.axes[1].texts]
    assert "60" in texts and any(t.endswith("?") for t in texts)


def test_all_collectives_used_here_are_supported_by_gloo(cluster2):
    # torch 2.14.1's gloo implements reduce_scatter, all_to_all and the AVG reduction; if a future
    # torch drops one, run_collective raises here and notebook 02 needs its explanation updated.
    states = cluster2.run(C.run_many, [("reduce_scatter", "distinct", "avg", 1), ("all_to_all", "distinct",
                                                                                  "sum", 1)])
    assert [s[0]["after"] for s in states] == [[5.0], [6.0]]  # avg(0, 10), avg(1, 11)
    assert [s[1]["after"] for s in states] == [[0.0, 10.0], [1.0, 11.0]]


def test_reference_models():
    assert C.after_values(C.reference("all_to_all", 3, "distinct")) == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
    assert C.after_values(C.reference("reduce_scatter", 2, "rank + 1", "product")) == [[2.0], [2.0]]
    assert C.after_values(C.reference("all_reduce", 3, "distinct", "max", 2)) == [[20.0, 21.0]] * 3
    assert C.after_values(C.reference("scatter", 3, "seed", numel=2)) == [[1, 1], [2, 2], [3, 3]]
    assert [s["before"] for s in C.reference("scatter", 3)] == [[1, 2, 3], None, None]
    assert C.after_values(C.reference("barrier", 2, "rank + 1")) == [[1.0], [2.0]]


@pytest.mark.parametrize("args, words", [
    (("all_sum", 2), "unknown collective 'all_sum'"),
    (("all_reduce", 2, "random"), "unknown tensor kind 'random'"),
    (("all_reduce", 2, "seed", "mean"), "unknown reduce op 'mean'"),
    (("all_reduce", 0), "world_size must be a whole number >= 1"),
    (("all_reduce", 2, "seed", "sum", 0), "numel (numbers per piece) must be"),
])
def test_reference_rejects_bad_choices(args, words):
    with pytest.raises(ConfigError) as info:
        C.reference(*args)
    assert words in str(info.value)


def test_compare_reports_the_rank():
    good = C.reference("all_reduce", 2)
    bad = [dict(s) for s in good]
    bad[1]["after"] = [3.0]
    assert C.compare(bad, good) == ["all_reduce: rank 1 has [3.0], the model says [2.0]"]


def test_barrier_nobody_leaves_before_the_last_arrives(cluster4):
    if cluster4.state == "broken":
        cluster4.restart()
    spans = timeline.flatten(cluster4.run(C.barrier_demo, stagger_s=0.05))
    barrier = [s for s in spans if s["label"] == "barrier"]
    last_arrival = max(s["start"] for s in barrier)
    assert len(barrier) == 4 and all(s["end"] >= last_arrival for s in barrier)
    waits = timeline.who_waited(cluster4.run(C.barrier_demo, stagger_s=0.05))
    assert {w["peer"] for w in waits if w["rank"] != 3} == {3}  # everyone waits for the last rank


@pytest.mark.slow
def test_explorer_redraws_on_every_control():
    from ppkit.widgets import CollectivesExplorer

    ex = CollectivesExplorer()
    assert C.after_values(ex.states) == [[4.0]] * 4
    assert "rank 3: [4]" in ex.summary.value
    first_figure, count = ex.figure, ex.redraws
    ex.op.value = "all_to_all"
    ex.tensor.value = "distinct"
    ex.world_size.value = 8
    assert ex.redraws == count + 3 and ex.figure is not first_figure
    assert len(ex.states) == 8 and ex.states[7]["after"][:2] == [7.0, 17.0]
    assert ex.reduce_op.disabled
    assert "rank 7: [7, 17, 27" in ex.summary.value
    texts = {t.get_text() for t in ex.figure.axes[1].texts}
    assert {"70", "77", "7"} <= texts
    ex.op.value = "reduce"
    assert not ex.reduce_op.disabled and "undefined" in ex.summary.value
    ex.numel.value = 2
    assert len(ex.states[0]["after"]) == 2


def test_explorer_exposes_stable_handles_for_browser_tests():
    from ppkit.widgets import CollectivesExplorer

    ex = CollectivesExplorer(op="broadcast", world_size=2)
    handles = {"op": ex.op, "world-size": ex.world_size, "tensor": ex.tensor, "reduce-op": ex.reduce_op,
               "numel": ex.numel, "summary": ex.summary, "output": ex.output}
    for name, widget in handles.items():
        assert f"ppkit-collectives-{name}" in widget._dom_classes
    assert (ex.op.description, ex.world_size.description, ex.tensor.description) == \
        ("collective", "world size", "tensor")
    assert (ex.world_size.min, ex.world_size.max) == (2, 8)
    assert "ppkit-collectives" in ex.widget._dom_classes
    assert "application/vnd.jupyter.widget-view+json" in ex._repr_mimebundle_()
