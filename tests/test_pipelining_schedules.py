"""The schedules past 1F1B (Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV): two
stages per rank, the same loss and gradients as one local ResNet50, each rank running torch's
plan, the bubble formulas against torch's plans, and impossible settings refused up front."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import ppkit
from ppkit.pipeline.schedules import bubble_formulas as bf
from ppkit.pipeline.schedules import compare as cmp
from ppkit.pipeline.schedules import looped_report, placement, torch_plans, verify
from ppkit.pipeline.schedules import stage as pp
from ppkit.pipeline.schedules.looped_run import merge_looped, one_stage_plan
from ppkit.pipeline.schedules.plan import Op, idle_share, simulate, span

matplotlib.use("Agg")

BATCH, MICROBATCHES, IMAGE = 8, 4, 32
RUN_TIMEOUT = 180
COUNTS = range(1, 13)
# one rank's (F, I, W) per micro-batch: equal, a heavier input gradient, a heavier forward
EQUAL_CASES = ((1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0))


@pytest.fixture(scope="module")
def batch():
    return pp.make_batch(BATCH, IMAGE)


@pytest.fixture(scope="module")
def reference(batch):
    return verify.reference_step(*batch, placement.FOUR_STAGE_CUTS)


@pytest.fixture(scope="module")
def plans(cluster2):
    """torch's plan (or its ValueError) for every schedule and 1..12 micro-batches on 2 ranks."""
    cases = [(s, m) for s in placement.SPECS for m in COUNTS]
    return cluster2.run(torch_plans.plans_on_ranks, cases, timeout=RUN_TIMEOUT)[0]


@pytest.fixture(scope="module")
def runs(cluster2, batch):
    """One step of each two-stage-per-rank schedule on the same batch."""
    return cmp.compare_looped(cluster2, *batch, MICROBATCHES, schedules=placement.MULTI_STAGE, steps=1,
                              timeout=RUN_TIMEOUT)


# -- pieces that need no cluster ---------------------------------------------------------------
def test_placement_of_each_schedule():
    assert placement.stage_to_rank("gpipe", 2) == [0, 1]
    assert placement.stage_to_rank("interleaved1f1b", 2) == [0, 1, 0, 1]
    assert placement.stage_to_rank("zbvzerobubble", 2) == [0, 1, 1, 0]  # the first and last stage on rank 0
    assert placement.stage_to_rank("dualpipev", 3) == [0, 1, 2, 2, 1, 0]
    assert placement.stages_of_rank("interleavedzerobubble", 1, 2) == [1, 3]
    assert placement.stages_of_rank("dualpipev", 0, 2) == [0, 3]


def test_stage_cuts():
    assert placement.stage_cuts("1f1b", 2) == ("layer2",)
    assert placement.stage_cuts("gpipe", 2, "layer3") == ("layer3",)
    assert placement.stage_cuts("zbvzerobubble", 2) == placement.FOUR_STAGE_CUTS
    with pytest.raises(ppkit.ConfigError, match="runs 4 stages, so it needs 3 cut point"):
        placement.stage_cuts("dualpipev", 2, "layer2")
    with pytest.raises(ppkit.ConfigError, match="distinct and in forward order"):
        placement.stage_cuts("dualpipev", 2, ("layer3", "layer2", "layer1"))
    with pytest.raises(ppkit.ConfigError, match="unknown schedule 'zb'"):
        placement.stage_cuts("zb", 2)


@pytest.mark.parametrize("schedule, m, words", [
    ("interleaved1f1b", 5, ["ScheduleInterleaved1F1B cannot take num_microbatches=5 on 2 ranks",
                            "5 // 2 = 2 rounds of equal size, and 5 is not a multiple of 2",
                            "Counts that work here: 1, 2, 3, 4, 6, 8"]),
    ("interleavedzerobubble", 7, ["num_microbatches=7", "not a multiple of 3"]),
    ("dualpipev", 3, ["ScheduleDualPipeV cannot take num_microbatches=3",
                      "at least as many micro-batches as stages (4 stages on 2 ranks)",
                      "Counts that work here: 4, 5, 6"]),
    ("1f1b", 1, ["Schedule1F1B cannot take num_microbatches=1", "2 stages on 2 ranks", "work here: 2, 3"]),
    ("zbvzerobubble", 0, ["num_microbatches=0", "whole number of at least 1"]),
    ("gpipe", True, ["num_microbatches=True"]),
])
def test_impossible_microbatch_counts_are_refused_saying_what_works(schedule, m, words):
    with pytest.raises(ppkit.ConfigError) as info:
        placement.check_microbatches(schedule, 2, m)
    for word in words:
        assert word in str(info.value)


def test_simulate_runs_each_rank_in_order_as_early_as_the_data_allows():
    plan = {0: [Op(0, "F", 0), Op(0, "I", 0), Op(0, "W", 0)],
            1: [Op(1, "F", 0), Op(1, "B", 0)]}
    works = simulate(plan, {(0, "F"): 1.0, (1, "F"): 2.0, (1, "B"): 3.0, (0, "I"): 0.5, (0, "W"): 0.25})
    when = {(w.stage, w.kind): (w.start, w.end) for w in works}
    assert when == {(0, "F"): (0, 1), (1, "F"): (1, 3), (1, "B"): (3, 6), (0, "I"): (6, 6.5),
                    (0, "W"): (6.5, 6.75)}
    assert span(works) == 6.75
    assert idle_share(works, 2) == pytest.approx(1 - (1.75 + 5) / (2 * 6.75))
    with pytest.raises(ppkit.ConfigError, match="deadlock"):
        simulate({0: [Op(0, "B", 0), Op(0, "F", 0)], 1: [Op(1, "F", 0)]}, lambda op: 1.0)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 2), (2, 4), (3, 6), (4, 4), (4, 9)])
def test_gpipe_and_1f1b_plans_have_the_textbook_bubble(schedule, p, m):
    plan = one_stage_plan(schedule, p, m)
    assert bf.plan_idle_share(schedule, plan) == pytest.approx(bf.formula_idle_share(schedule, p, m))
    assert bf.formula_idle_share(schedule, p, m) == pytest.approx((p - 1) / (m + p - 1))


def test_merge_looped_puts_each_stage_on_its_rank():
    def rank(r, stages, events, loss):
        return {"rank": r, "stages": stages, "schedule": "zbvzerobubble", "num_microbatches": 1,
                "microbatch_size": 2, "cuts": placement.FOUR_STAGE_CUTS, "step_times": [1.0 + r],
                "step_start": 10.0 + r, "events": events, "plan": {0: [], 1: []}, "peak_activation_bytes": 5 * r,
                "loss": loss, "grads": {s: {"w": torch.full((1,), float(s))} for s in stages}}

    run = merge_looped([rank(0, [0, 3], [(0, "F", 0, 10.0, 10.5), (3, "F", 0, 12.0, 12.5)], 2.5),
                        rank(1, [1, 2], [(1, "F", 0, 11.0, 11.5), (2, "F", 0, 11.5, 12.0)], None)])
    assert run.stage_ranks == [0, 1, 1, 0] and run.stages_per_rank == 2 and run.num_ranks == 2
    assert run.loss == 2.5 and run.step_times == [2.0] and run.peak_activation_bytes == [0, 5]
    assert [g["w"].item() for g in run.grads] == [0, 1, 2, 3]
    assert [(w.rank, w.stage, w.start) for w in run.works] == [(0, 0, 0.0), (0, 3, 2.0), (1, 1, 1.0), (1, 2, 1.5)]
    assert run.order(1) == [Op(1, "F", 0), Op(2, "F", 0)]


# -- torch's plans (built on a real 2-rank group, no step run) ----------------------------------
def test_ppkit_refuses_exactly_the_counts_torch_refuses(plans):
    for (schedule, m), plan in plans.items():
        refused_by_torch = isinstance(plan, str)
        assert refused_by_torch == (not placement.takes_microbatches(schedule, 2, m)), (schedule, m, plan)
        if refused_by_torch:
            assert plan.startswith("ValueError")


@pytest.mark.parametrize("schedule", placement.MULTI_STAGE)
def test_formulas_match_torchs_plans_with_equal_stages(plans, schedule):
    least = {"zbvzerobubble": 3, "dualpipev": 4}.get(schedule, 2)  # the formulas' "m >= ..." for p = 2
    cases = EQUAL_CASES[:1] if "F = I = W" in bf.FORMULAS[schedule].assumes else EQUAL_CASES
    checked = 0
    for m in COUNTS:
        plan = plans[(schedule, m)]
        if isinstance(plan, str) or m < least:
            continue
        for f, i, w in cases:
            got = bf.plan_idle_share(schedule, plan, f, i, w)
            assert got == pytest.approx(bf.formula_idle_share(schedule, 2, m, f, i, w)), (m, f, i, w)
            checked += 1
    assert checked >= 4


def test_interleaving_halves_the_bubble_and_zero_bubble_cuts_it_further(plans):
    idle = {s: bf.plan_idle_share(s, plans[(s, 4)]) for s in ("interleaved1f1b", "interleavedzerobubble")}
    assert bf.plan_idle_share("1f1b", one_stage_plan("1f1b", 2, 4)) == pytest.approx(3 / 15)  # 3 of 4 x 3 + 3
    assert idle["interleaved1f1b"] == pytest.approx(1.5 / 13.5)  # bubble / v
    assert idle["interleavedzerobubble"] == pytest.approx(0.5 / 12.5)  # (F + I - W) / v with F = I = W


# -- the schedules on a real 2-rank gloo cluster ------------------------------------------------
@pytest.mark.parametrize("schedule", placement.MULTI_STAGE)
def test_loss_and_gradients_equal_one_local_model(runs, reference, schedule):
    run = runs[schedule]
    assert run.num_stages == 4 and run.cuts == placement.FOUR_STAGE_CUTS
    assert run.loss == pytest.approx(reference["loss"], rel=verify.LOSS_RTOL)
    assert verify.grad_difference(run.grads, reference["grads"]) < verify.GRAD_RTOL
    assert max(g.abs().max().item() for stage in run.grads for g in stage.values()) > 0


@pytest.mark.parametrize("schedule", placement.MULTI_STAGE)
def test_each_rank_runs_torchs_plan_on_its_own_stages(runs, schedule):
    run = runs[schedule]
    assert run.stage_ranks == placement.stage_to_rank(schedule, 2)
    for rank in range(2):
        assert run.order(rank) == run.plan[rank]
        assert {op.stage for op in run.plan[rank]} == set(placement.stages_of_rank(schedule, rank, 2))
    for stage in range(4):
        for mb in range(MICROBATCHES):
            kinds = sorted(w.kind for w in run.works if w.stage == stage and w.microbatch == mb)
            assert kinds in (["B", "F"], ["F", "I", "W"]), (stage, mb, kinds)
    split = {w.kind for w in run.works} >= {"I", "W"}
    assert split == placement.SPECS[schedule].splits_backward


def test_bubble_model_table_and_drawing(runs):
    for run in runs.values():
        model = run.prediction()
        assert sorted((w.stage, w.kind, w.microbatch) for w in model) == sorted(
            (w.stage, w.kind, w.microbatch) for w in run.works)
        assert 0 < run.predicted_span() and 0 <= run.predicted_idle_share() < 1 and 0 <= run.idle_share() < 1
        assert len(run.peak_activation_bytes) == 2 and min(run.peak_activation_bytes) > 0
    table = looped_report.format_looped_table(runs)
    assert "(p-1)(F+B)/v" in table and "MiB" in table and "dualpipev" in table
    fig = looped_report.plot_looped(runs)
    assert len(fig.axes) == 2 * len(runs)


def test_impossible_settings_are_refused_before_any_rank_runs(cluster2, batch):
    with pytest.raises(ppkit.ConfigError, match="num_microbatches=5"):
        cmp.run_looped(cluster2, *batch, "interleaved1f1b", num_microbatches=5)
    with pytest.raises(ppkit.ConfigError, match="does not split into 6 equal micro-batches"):
        cmp.run_looped(cluster2, *batch, "zbvzerobubble", num_microbatches=6)
    with pytest.raises(ppkit.ConfigError, match="needs 3 cut point"):
        cmp.run_looped(cluster2, *batch, "dualpipev", cut="layer2")
    with pytest.raises(ppkit.ConfigError, match="Schedule1F1B cannot take num_microbatches=1"):
        cmp.compare_looped(cluster2, *batch, 1)
    with pytest.raises(ppkit.ConfigError, match="put several stages on a rank|puts two stages on each rank"):
        cmp.run_schedule(cluster2, *batch, "dualpipev")
    assert cluster2.state == "ready"
    assert cluster2.run(lambda rank, world_size: rank * 10) == [0, 10]


@pytest.mark.slow
def test_the_formulas_hold_on_four_ranks_too(cluster4):
    """Each multi-stage formula against torch's plans for p = 4 (where m >= p, resp. 2p - 1 or 2p)."""
    least = {"interleaved1f1b": 4, "interleavedzerobubble": 4, "zbvzerobubble": 7, "dualpipev": 8}
    cases = [(s, m) for s in placement.MULTI_STAGE for m in (least[s], 8, 12)]
    plans = cluster4.run(torch_plans.plans_on_ranks, cases, timeout=RUN_TIMEOUT)[0]
    for (schedule, m), plan in plans.items():
        assert not isinstance(plan, str), plan
        equal = "F = I = W" in bf.FORMULAS[schedule].assumes
        for f, i, w in EQUAL_CASES[:1] if equal else EQUAL_CASES:
            assert bf.plan_idle_share(schedule, plan, f, i, w) == pytest.approx(
                bf.formula_idle_share(schedule, 4, m, f, i, w)), (schedule, m, f, i, w)
