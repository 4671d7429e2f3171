"""Lesson 08b: a step's memory measured with torch's tools against the formulas; recomputation and accumulation
give the plain step's gradients; DDP's no_sync skips k - 1 all-reduces; the explorer. The exercise's checker:
tests/test_predict_peak_checker.py."""

from __future__ import annotations

import pytest
import torch

from ppkit.errors import ConfigError
from ppkit.lessons import step_memory as sm
from ppkit.lessons import step_peak as sp
from ppkit.lessons import step_scale
from ppkit.lessons import step_tradeoffs as st
from ppkit.lessons.step_guess import compare
from ppkit.widgets import StepMemoryExplorer

SIZE = sm.SIZE


def test_the_parameter_count_is_the_formulas():
    assert sum(p.numel() for p in sm.GPT(SIZE).parameters()) == SIZE.params()
    wide = sm.Size(vocab=100, d_model=32, heads=2, layers=3)
    assert sum(p.numel() for p in sm.GPT(wide).parameters()) == wide.params()


def test_the_static_part_is_16_bytes_a_parameter_in_fp32_and_in_mixed_precision():
    model = sm.GPT(SIZE)
    optimizer = torch.optim.Adam(model.parameters())
    model.loss(sm.batch(SIZE, 2, 16)).backward()
    optimizer.step()
    measured = sm.static_measured(model, optimizer)
    assert {k: measured[k] for k in ("params", "grads", "adam")} == sm.static_formula(SIZE.params(), "fp32")
    assert measured["adam step counters"] == 4 * len(list(model.parameters()))
    mixed = st.mixed_precision(SIZE, 16, 2)
    formula = sm.static_formula(SIZE.params(), "mixed")
    assert {k: mixed[k] for k in formula} == formula and sum(formula.values()) == 16 * SIZE.params()
    assert mixed["fp32 gradient copies (during the update)"] == 4 * SIZE.params()


def test_the_breakdown_in_16_bit_with_dropout_is_the_playbooks_formula():
    for s, b, h, a in ((128, 2, 64, 4), (2048, 1, 4096, 32), (7, 3, 12, 3)):
        assert sm.kept_formula(s, b, h, a, 2, dropout=True) == pytest.approx(sm.playbook_activations(s, b, h, a))


@pytest.mark.parametrize("s,b", [(32, 1), (64, 3), (128, 2)])
def test_what_autograd_keeps_per_layer_is_the_breakdown_plus_norm_statistics_and_the_mask(s, b):
    saved = sm.saved_by_layer(sm.GPT(SIZE), sm.batch(SIZE, b, s))
    extra = 16 * s * b + s * s  # 2 LayerNorms x (mean, 1/std) x s b floats; the causal mask, s x s booleans
    assert saved.bytes["layer 0"] == saved.bytes["layer 1"] == sm.formula_for(SIZE, s, b) + extra
    fused = sm.Size(attention="sdpa")
    kept = sm.saved_by_layer(sm.GPT(fused), sm.batch(fused, b, s)).bytes["layer 0"]
    assert kept == sm.formula_for(fused, s, b) + 16 * s * b  # no s x s matrix, no mask
    outside = saved.bytes["outside the layers"]
    assert outside == pytest.approx(sp.outside_formula(SIZE, s, b), rel=0.01)


def test_recomputation_keeps_what_the_formula_says_and_gives_the_same_gradients():
    s, b = 128, 2
    tokens = sm.batch(SIZE, b, s)
    plain = st.gradients(SIZE, [tokens])
    for policy in ("selective", "full"):
        kept = sm.saved_by_layer(sm.GPT(SIZE).recompute(policy), tokens).total()
        assert kept == pytest.approx(sp.activations_formula(SIZE, s, b, policy), rel=0.02), policy
        assert st.largest_difference(plain, st.gradients(SIZE, [tokens], policy)) == 0.0, policy


@pytest.mark.parametrize("s,b,policy", [(128, 4, "none"), (256, 4, "none"), (256, 4, "selective"),
                                        (256, 4, "full"), (64, 8, "none")])
def test_the_predicted_peak_is_within_five_percent_of_memtrackers(s, b, policy):
    measured = sp.measure_step(SIZE, s, b, policy=policy)
    assert measured.peak["params"] == 4 * SIZE.params() and measured.peak["optimizer"] >= 8 * SIZE.params()
    assert measured.total == pytest.approx(sp.predicted_peak(SIZE, s, b, policy=policy)["total"], rel=0.05)


@pytest.mark.parametrize("s,b,policy,moment", [(32, 1, "none", "optimizer.step()"), (8, 1, "none", "optimizer.step()"),
                                               (32, 2, "full", "the first block's backward"),
                                               (64, 2, "full", "the first block's backward")])
def test_a_short_steps_peak_is_in_the_optimizer_or_with_full_recompute_mid_backward(s, b, policy, moment):
    """Per-tensor Adam's step holds 16 bytes per parameter: above backward's start once the activations are few;
    with full recomputation the first block's backward holds every other gradient and the rebuilt block."""
    measured = sp.measure_step(SIZE, s, b, policy=policy)
    assert measured.total == pytest.approx(sp.predicted_peak(SIZE, s, b, policy=policy)["total"], rel=0.05)
    assert sp.peak_moment(SIZE, s, b, policy=policy) == moment
    if moment == "optimizer.step()":
        assert measured.peak["grads"] == 4 * SIZE.params() and measured.peak["activations"] < 1024


def test_at_a_short_sequences_peak_no_gradient_exists_yet():
    """zero_grad(set_to_none=True) frees them; the peak is at backward's start, before it makes new ones."""
    measured = sp.measure_step(SIZE, 64, 8)
    assert measured.peak.get("grads", 0) == 0
    assert measured.peak["temporaries"] == 2 * 4 * 64 * 8 * SIZE.vocab  # cross-entropy's two gradients


@pytest.mark.slow
def test_where_the_peak_is_depends_on_adams_implementation():
    """Per-tensor Adam (CPU's default): the peak is in backward here, above optimizer.step()'s 16 bytes per
    parameter and one tensor's temporaries. Foreach Adam (CUDA's default) makes sqrt(exp_avg_sq) of every
    parameter at once, 4 bytes per parameter more: at s = 32, b = 2 that moves the peak into the step."""
    p = SIZE.params()
    per_tensor, foreach = sp.phase_peaks(SIZE, 32, 2), sp.phase_peaks(SIZE, 32, 2, foreach=True)
    assert per_tensor["forward and backward"] == foreach["forward and backward"]
    assert 0 <= foreach["optimizer.step()"] - 20 * p < 1024  # weights, gradients, two moments, one sqrt of each;
    # and Adam's step counters
    assert 16 * p < per_tensor["optimizer.step()"] < per_tensor["forward and backward"]
    assert foreach["optimizer.step()"] > foreach["forward and backward"]
    long = sp.phase_peaks(SIZE, 256, 4, foreach=True)  # activations outweigh 8 bytes per parameter
    assert long["forward and backward"] > long["optimizer.step()"]
    for peaks, adam in ((per_tensor, False), (foreach, True), (long, True)):
        s, b = (32, 2) if peaks is not long else (256, 4)
        assert max(peaks.values()) == pytest.approx(sp.predicted_peak(SIZE, s, b, foreach=adam)["total"], rel=0.05)
    assert sp.peak_moment(SIZE, 32, 2, foreach=True) == "optimizer.step()"
    assert sp.peak_moment(SIZE, 32, 2) == sp.peak_moment(SIZE, 256, 4, foreach=True) == "backward's start"


def test_accumulation_gives_the_big_steps_gradients_at_a_smaller_peak():
    micro = [sm.batch(SIZE, 2, 128, seed=10 + i) for i in range(4)]
    difference = st.largest_difference(st.gradients(SIZE, [torch.cat(micro)]), st.gradients(SIZE, micro))
    assert 0 < difference < st.TOLERANCE  # the sums run in another order: close, not bit-equal
    accumulated, big = sp.measure_step(SIZE, 128, 2, 4), sp.measure_step(SIZE, 128, 8)
    assert accumulated.total < 0.5 * big.total
    assert accumulated.peak["grads"] == 4 * SIZE.params()  # kept between the micro-steps


def test_autocast_keeps_bf16_activations_and_fp32_norms():
    dtypes = st.autocast_dtypes(SIZE, 32, 2)
    assert dtypes["addmm"] == "bfloat16" and dtypes["native_layer_norm"] == "float32"
    model = sm.GPT(SIZE)
    plain, autocast = (sm.saved_by_layer(model, sm.batch(SIZE, 2, 64), autocast=a) for a in (False, True))
    assert autocast.by_dtype["bfloat16"] > 0 and autocast.by_dtype["float32"] > 0
    assert plain.bytes["layer 0"] / 2 < autocast.bytes["layer 0"] < plain.bytes["layer 0"]


@pytest.mark.slow
def test_no_sync_skips_all_but_one_all_reduce_and_keeps_the_gradients(cluster2):
    k = 3
    reference = st.ddp_reference(SIZE, 32, 2, k, 2)
    for use_no_sync, calls in ((False, k), (True, 1)):
        ranks = cluster2.run(st.ddp_accumulate, SIZE, 32, 2, k, use_no_sync)
        for r in ranks:
            assert r["all_reduces"] == calls and r["bytes"] == calls * 4 * SIZE.params()
            assert st.largest_difference(reference, r["grads"]) < st.TOLERANCE


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="recompute policy 'some'"):
        sm.GPT(SIZE).recompute("some")
    with pytest.raises(ConfigError, match="micro-batch size must be a whole number of at least 1; got 0"):
        sp.predicted_peak(SIZE, 64, 0)
    with pytest.raises(ConfigError, match="at least one sequence"):
        sm.batch(SIZE, 0, 8)


def test_the_explorers_predicted_bar_is_the_predicted_peak_at_whichever_moment():
    """At s = 32, b = 1 the peak is in optimizer.step(): the bar draws that moment's parts, up to the prediction."""
    from ppkit.lessons import step_plots

    predicted = sp.predicted_peak(SIZE, 32, 1)
    fig = step_plots.plot_peak(sp.measure_step(SIZE, 32, 1), predicted)
    bars = [p for p in fig.axes[0].patches if p.get_x() < 0.5]  # the predicted bar, at x = 0
    assert max(p.get_y() + p.get_height() for p in bars) == pytest.approx(predicted["total"] / step_plots.MIB)


def test_the_explorer_measures_each_setting_once():
    ex = StepMemoryExplorer(SIZE, seq_len=64, microbatch_size=2)
    assert ex.redraws == 1 and ex.measurement.total == sp.measure_step(SIZE, 64, 2).total
    assert "s = 64, micro-batch 2, 1 accumulation step(s), recompute none" in ex.summary.value
    ex.recompute.value = "full"
    assert ex.measurement.policy == "full" and ex.redraws == 2 and "recompute full" in ex.summary.value
    ex.recompute.value = "none"  # measured already: redrawn, not run again
    assert ex.redraws == 3 and len(ex.measured) == 2
    with pytest.raises(ConfigError):
        StepMemoryExplorer(SIZE, accumulation_steps=0)


def test_a_guess_is_compared_with_the_measurement_or_asked_for():
    assert compare("x", None, 10) == "x: no guess written (set it in the cell above, then run both again)"
    assert compare("x", "lots", 10).startswith("x: the guess should be a number, got str")
    assert compare("x", 10.5, 10) == "x: your guess 10.5 against 10 measured (+5%: within 10%)"
    assert compare("x", 15, 10).endswith("(+50%: within a factor of 2)")
    assert compare("x", 30, 10).endswith("(+200%: off)")


def test_the_real_size_view_is_the_playbooks_formulas():
    m = step_scale.REAL_SIZES["8B"]
    none, selective, full = (step_scale.memory_gib("8B", 4096, 1, p) for p in sm.POLICIES)
    static = sum(v for k, v in none.items() if k != "activations")
    assert static * step_scale.GIB == pytest.approx(16 * m["params"])
    assert none["activations"] * step_scale.GIB == pytest.approx(
        m["layers"] * sm.playbook_activations(4096, 1, m["h"], m["a"]))
    assert full["activations"] < selective["activations"] < none["activations"]
    assert full["activations"] * step_scale.GIB == 2 * 4096 * m["h"] * m["layers"]
    assert len(step_scale.plot_memory(seq_lens=(1024, 2048)).axes) == 4
