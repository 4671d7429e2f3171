"""Notebook 14's planted-bug exercise (tp_mlp): the planted bug and each wrong fix fail with a message that names
it; the registered solution and another right answer pass; the stub is "not written yet". docs/exercises.md lists
the rows. The checks share one 6-rank cluster without a process group (bare6)."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_parity, solutions
from ppkit.lessons import parity_tp
from ppkit.lessons.tensor_parallel import copy_to_parallel, reduce_from_parallel

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.slow  # every check runs ranks


def _rest(x, fc1, fc2, log):
    return reduce_from_parallel(F.linear(F.gelu(fc1(x)), fc2.weight), log, "fc2") + fc2.bias


def all_reduced_in_forward_too(x, fc1, fc2, log):
    return _rest(reduce_from_parallel(copy_to_parallel(x, log, "fc1"), log, "fc1"), fc1, fc2, log)


def divided_by_world_size(x, fc1, fc2, log):
    x = copy_to_parallel(x, log, "fc1")
    if x.requires_grad:
        x.register_hook(lambda grad: grad / dist.get_world_size())
    return _rest(x, fc1, fc2, log)


def summed_twice(x, fc1, fc2, log):
    return _rest(copy_to_parallel(copy_to_parallel(x, log, "fc1"), log, "fc1"), fc1, fc2, log)


def bias_on_every_rank(x, fc1, fc2, log):
    x = copy_to_parallel(x, log, "fc1")
    return reduce_from_parallel(F.linear(F.gelu(fc1(x)), fc2.weight, fc2.bias), log, "fc2")


class _SumGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


def own_autograd_function(x, fc1, fc2, log):  # right: the learner's own f instead of copy_to_parallel
    return _rest(_SumGradients.apply(x), fc1, fc2, log)


def tp_mlp(x, fc1, fc2, log):
    """The stub as the notebook ships it."""
    raise NotImplementedError("replace this line with your code")


@pytest.mark.parametrize(("fn", "named"), [
    (parity_tp.planted_tp_mlp, "world_size 2: the bug is still there: each rank's gradient of the block's input is "
                               "only its own part"),
    (all_reduced_in_forward_too, "world_size 2: the block's input was all_reduced in forward too: every rank already "
                                 "holds all of x, so the block saw 2 x x"),
    (divided_by_world_size, "world_size 2: the input's gradient was divided by 2: the ranks' parts must be summed"),
    (summed_twice, "world_size 2: the input's gradient is 2x too large: it was summed twice"),
    (bias_on_every_rank, "world_size 2: fc2's bias counts 2 times: each rank added it before the sum"),
], ids=lambda v: getattr(v, "__name__", "")[:30] if callable(v) else "")
def test_each_wrong_fix_is_named(fn, named, bare6):
    with pytest.raises(ExerciseFailed) as caught:
        check_parity.check_tp_mlp(fn, cluster=bare6)
    failures = caught.value.failures
    assert failures[0].startswith(named), failures
    assert failures[1].startswith(named.replace("world_size 2", "world_size 4").replace(" 2 x x", " 4 x x")
                                  .replace("by 2", "by 4").replace("2x", "4x").replace("2 times", "4 times")), failures
    assert "(ppkit.compare_runs: step 0, " in failures[0]


def test_the_right_answers_pass(bare6, capsys):
    for fn in (solutions.tp_mlp, own_autograd_function):
        report = check_parity.check_tp_mlp(fn, cluster=bare6)
        assert report.passed and report.cases == ("world_size 2, 2 SGD steps against one process",
                                                  "world_size 4, 2 SGD steps against one process")
    assert "tp_mlp: passed all 2 cases" in capsys.readouterr().out


def test_the_stub_is_not_written_yet(bare6, capsys):
    assert check_parity.check_tp_mlp(tp_mlp, cluster=bare6) is None
    assert "not written yet: replace the NotImplementedError in tp_mlp" in capsys.readouterr().out


def test_a_block_that_raises_is_named_with_its_error(bare6):
    def wrong_shape(x, fc1, fc2, log):
        return fc2(x)  # fc2 takes this rank's hidden features, not x

    with pytest.raises(ExerciseFailed, match="RuntimeError"):
        check_parity.check_tp_mlp(wrong_shape, cluster=bare6)
