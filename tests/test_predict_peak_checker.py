"""Notebook 08b's exercise, predict_peak: the right answer passes, and each plausible wrong answer fails with a
message that names the part it got wrong (docs/exercises.md lists them)."""

from __future__ import annotations

import pytest

from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_memory, solutions
from ppkit.lessons import step_peak as sp


def without(*names, plus=0.0):
    """The right answer with the parts whose names contain each of ``names`` left out (and ``plus(size, s, b)``)."""
    def predict_peak(size, seq_len, microbatch_size):
        parts = check_memory.parts(size, seq_len, microbatch_size)
        dropped = [k for k in parts if any(n in k for n in names)]
        assert len(dropped) == len(names), (names, list(parts))  # the test's own names must each match a part
        extra = plus(size, seq_len, microbatch_size) if plus else 0
        return sum(v for k, v in parts.items() if k not in dropped) + extra
    return predict_peak


def gradients(size, s, b):
    return 4 * size.params()


def one_layer_only(size, s, b):
    parts = list(check_memory.parts(size, s, b).values())
    return -sum(parts[2:7]) * (size.layers - 1) / size.layers


def matrices_under_sdpa(size, s, b):
    return 4 * size.layers * size.heads * s * s * b if size.attention == "sdpa" else 0


def half_cross_entropy(size, s, b):
    return 4 * s * b * size.vocab


def old_solution(size, seq_len, microbatch_size):
    """The solution before issue 42: 16 bytes per parameter, the s x s matrices whatever the attention, one
    attention matrix's gradient as backward's transient."""
    s, b, h, a = seq_len, microbatch_size, size.d_model, size.heads
    per_layer = 4 * (16 * s * b * h + a * s * s * b)
    outside = 2 * 8 * s * b + 4 * (2 * s * b * h + s * b * size.vocab)
    return 16 * size.params() + size.layers * per_layer + outside + 4 * a * s * s * b


WRONG = {
    "with the gradients": (without(plus=gradients), "the gradients (4 bytes x parameters), which do not exist yet"),
    "no weights": (without("the weights"), "the weights (4 bytes x parameters)"),
    "no Adam": (without("Adam's two moments"), "Adam's two moments (8 bytes x parameters)"),
    "one layer": (without(plus=one_layer_only), "one layer's activations"),
    "no attention matrices": (without("the attention matrices"), "the attention matrices (a s^2 b per layer)"),
    "no MLP": (without("the MLP's"), "the MLP's activations (9 s b h per layer)"),
    "no GELU input": (without(plus=lambda size, s, b: -4 * 4 * size.layers * s * b * size.d_model),
                      "the GELU's input or fc2's input (4 s b h per layer)"),
    "no Q K V": (without("Q K V"), "Q K V, their input and the projection's input"),
    "no norms' inputs": (without("the norms' inputs"), "the norms' inputs (2 s b h per layer)"),
    "nothing outside the layers": (without("token ids", "final norm's", "log-probabilities"),
                                   "what autograd keeps outside the layers"),
    "no log-probs": (without("the log-probabilities"), "the log-probabilities (s b vocab)"),
    "no cross-entropy backward": (without("cross-entropy's backward"), "cross-entropy's backward: gradients"),
    "one cross-entropy gradient": (without(plus=lambda *a: -half_cross_entropy(*a)), "one of cross-entropy's two"),
    "SDPA's matrices kept": (without(plus=matrices_under_sdpa), "which SDPA never keeps"),
    "the solution before issue 42": (old_solution, "the gradients (4 bytes x parameters), which do not exist yet"),
    "the lesson's predictor": (lambda size, s, b: sp.predicted_peak(size, s, b)["total"],
                               "LessonFormulaUsed: your function called step_peak.predicted_peak, the lesson's own"),
    "not a number": (lambda size, s, b: "lots", "expected a positive number of bytes, got str"),
}


def test_the_right_answer_is_the_parts_and_within_half_a_percent_of_each_measurement():
    for size, s, b in check_memory.SETTINGS:
        assert solutions.predict_peak(size, s, b) == sum(check_memory.parts(size, s, b).values())
        measured = check_memory.measured_peak(size, s, b)
        assert abs(solutions.predict_peak(size, s, b) / measured - 1) < 0.01, (s, b)
        assert abs(sp.predicted_peak(size, s, b)["total"] / measured - 1) < 0.01, (s, b)
        assert sp.peak_moment(size, s, b) == "backward's start", (s, b)  # what parts() describes
    report = check_memory.check_predict_peak(solutions.predict_peak)
    assert report.passed and len(report.cases) == 3


@pytest.mark.parametrize("name", WRONG)
def test_each_wrong_answer_fails_naming_its_part(name):
    fn, named = WRONG[name]
    with pytest.raises(ExerciseFailed) as failed:
        check_memory.check_predict_peak(fn)
    assert named in str(failed.value), str(failed.value)


def test_every_part_of_five_percent_or_more_somewhere_is_caught_and_the_smaller_ones_are_not():
    """The claim in check_memory's docstring: what leaving out one part does, part by part and setting by setting."""
    names = list(check_memory.parts(*check_memory.SETTINGS[0]))
    for name in names:
        shares = [check_memory.parts(*st)[name] / check_memory.measured_peak(*st) for st in check_memory.SETTINGS]
        fn = without(name)
        if max(shares) >= 0.05:
            with pytest.raises(ExerciseFailed, match="too low"):
                check_memory.check_predict_peak(fn)
        else:
            assert check_memory.check_predict_peak(fn).passed, name
