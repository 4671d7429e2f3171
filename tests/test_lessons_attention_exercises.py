"""The checker of notebook 11's exercise passes the solution, reports a stub as not written, and names
the mistake of a wrong merge."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_attention as ex
from ppkit.exercises import solutions
from ppkit.lessons.ring_attention import merge


def stub(out_a, lse_a, out_b, lse_b):
    raise NotImplementedError("write the merge here")


def average(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def unweighted_sum(out_a, lse_a, out_b, lse_b):
    return out_a + out_b, torch.logaddexp(lse_a, lse_b)


def overflows(out_a, lse_a, out_b, lse_b):
    total = torch.exp(lse_a) + torch.exp(lse_b)
    out = (out_a * torch.exp(lse_a).unsqueeze(-1) + out_b * torch.exp(lse_b).unsqueeze(-1)) / total.unsqueeze(-1)
    return out, torch.log(total)


def max_for_lse(out_a, lse_a, out_b, lse_b):
    return merge(out_a, lse_a, out_b, lse_b)[0], torch.maximum(lse_a, lse_b)


def sum_of_lse(out_a, lse_a, out_b, lse_b):
    return merge(out_a, lse_a, out_b, lse_b)[0], lse_a + lse_b


def nan_without_keys(out_a, lse_a, out_b, lse_b):  # torch's sigmoid form, with the parts swapped
    return out_b - F.sigmoid(lse_a - lse_b).unsqueeze(-1) * (out_b - out_a), lse_b - F.logsigmoid(lse_b - lse_a)


def only_out(out_a, lse_a, out_b, lse_b):
    return merge(out_a, lse_a, out_b, lse_b)[0]


def lse_keepdim(out_a, lse_a, out_b, lse_b):
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    return out, lse.unsqueeze(-1)


def wrong_weights(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_b - lse).unsqueeze(-1) + out_b * torch.exp(lse_a - lse).unsqueeze(-1), lse


def test_the_solution_and_other_right_answers_pass(capsys):
    for fn in (solutions.merge_partials, merge):
        report = ex.check_merge_partials(fn)
        assert report.passed and len(report.cases) == 4
    assert "log-sum-exp merge: passed all 4 cases" in capsys.readouterr().out


def test_a_stub_is_not_written_yet(capsys):
    assert ex.check_merge_partials(stub) is None
    assert "not written yet: replace the NotImplementedError in stub" in capsys.readouterr().out


@pytest.mark.parametrize("fn, says", [
    (average, "keys split 3 + 5: out is the plain average of out_a and out_b"),
    (unweighted_sum, "out is out_a + out_b: each needs its weight exp(lse_x - lse)"),
    (overflows, "large scores (lse up to ~1000): the result holds inf or NaN: exp() of a number above ~88 "
                "overflows float32, and here lse reaches 1026"),
    (max_for_lse, "keys split 1 + 7: lse is the larger of lse_a and lse_b"),
    (sum_of_lse, "lse is lse_a + lse_b, which multiplies the two denominators"),
    (nan_without_keys, "some rows saw no key of B (out_b 0, lse_b -inf): the result holds inf or NaN"),
    (only_out, "expected a pair (out, lse), got one tensor of shape (1, 2, 5, 4)"),
    (lse_keepdim, "lse has shape (1, 2, 5, 1), expected (1, 2, 5) (the shape of lse_a)"),
    (wrong_weights, "keys split 3 + 5: lse is right but out is wrong at [0, 0, 0, 0] expected"),
])
def test_mistakes_are_named(fn, says):
    with pytest.raises(ExerciseFailed) as info:
        ex.check_merge_partials(fn)
    assert says in str(info.value), str(info.value)


def test_overflow_is_the_only_problem_of_the_naive_formula():
    with pytest.raises(ExerciseFailed) as info:
        ex.check_merge_partials(overflows)
    assert len(info.value.failures) == 1


def test_a_raising_answer_is_reported():
    def breaks(out_a, lse_a, out_b, lse_b):
        raise ValueError("shapes")
    with pytest.raises(ExerciseFailed, match="keys split 3 \\+ 5: your function raised ValueError: shapes"):
        ex.check_merge_partials(breaks)
