"""Notebook 02's planted-bug exercise (issue 47): the fix passes; the planted loop and each wrong fix are named."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import ppkit
from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_collective_bug as ex
from ppkit.exercises import solutions
from ppkit.lessons import collective_bug as bug

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bare():
    with ppkit.Cluster(4, "gloo", process_group=False, timeout=30) as cluster:
        yield cluster


def failures(fn, bare) -> list[str]:
    with pytest.raises(ExerciseFailed) as info:
        ex.check_logged_train_loop(fn, cluster=bare)
    assert bare.state == "ready"  # handed back usable
    return list(info.value.failures)


# -- wrong fixes a learner might make ------------------------------------------------------------

def loop(rank, world_size, steps, log_on=lambda rank: True, reduce_loss=True, divide_loss=True, divide_grad=True):
    weights, logged = torch.zeros(3), []
    for step in range(steps):
        loss, grad = bug.loss_and_grad(weights, *bug.batch(rank, step))
        dist.all_reduce(grad)
        weights -= bug.LR * grad / (world_size if divide_grad else 1)
        if log_on(rank) and step % bug.LOG_EVERY == 0:
            if reduce_loss:
                dist.all_reduce(loss)
            logged.append(loss.item() / (world_size if reduce_loss and divide_loss else 1))
    return logged, weights.tolist()


def deletes_the_all_reduce(rank, world_size, steps):
    return loop(rank, world_size, steps, reduce_loss=False)


def logs_the_sum(rank, world_size, steps):
    return loop(rank, world_size, steps, divide_loss=False)


def forgets_the_gradient_average(rank, world_size, steps):
    return loop(rank, world_size, steps, divide_grad=False)


def only_rank_0_logs_without_the_collective(rank, world_size, steps):
    return loop(rank, world_size, steps, log_on=lambda rank: rank == 0, reduce_loss=False)


def half_written(rank, world_size, steps):
    raise NotImplementedError("write the loop")


# -- the checks ----------------------------------------------------------------------------------

def test_the_solution_passes(bare, capsys):
    report = ex.check_logged_train_loop(solutions.logged_train_loop, cluster=bare)
    assert report.passed and list(report.cases) == ["world_size 4, 4 steps, the loss logged every 2"]
    assert "logged train loop: passed" in capsys.readouterr().out


def test_the_planted_loop_itself_is_named_as_a_mismatch(bare):
    [text] = failures(bug.planted_loop, bare)
    assert "the ranks still call different collectives at the same point" in text, text
    assert "ALLREDUCE of []" in text and "ALLREDUCE of [3]" in text, text  # the loss (0-d) against the gradient


def test_each_wrong_fix_is_named(bare):
    assert failures(deletes_the_all_reduce, bare) == [
        "world_size 4: rank(s) [0, 1, 2, 3] logged its own loss, not the mean over the ranks: the loss's all_reduce "
        "was deleted rather than called on every rank"]
    assert failures(logs_the_sum, bare) == [
        "world_size 4: rank(s) [0, 1, 2, 3] logged the sum of the ranks' losses: divide by world_size (4)"]
    assert failures(forgets_the_gradient_average, bare) == [
        "world_size 4: rank(s) [0, 1, 2, 3] ended with other weights: the gradients' sum was not divided by "
        "world_size"]
    found = failures(only_rank_0_logs_without_the_collective, bare)
    assert "rank(s) [0] logged its own loss" in found[0] and "rank(s) [1, 2, 3] logged nothing" in found[1], found


def test_a_loop_still_raising_not_implemented_is_not_written(bare, capsys):
    assert ex.check_logged_train_loop(half_written, cluster=bare) is None
    assert "not written yet" in capsys.readouterr().out


def test_the_reference_logs_the_mean_of_the_ranks_own_losses():
    logged, weights, own = bug.reference(4, 4)
    assert len(logged) == 2 and logged[0] == pytest.approx(sum(own[r][0] for r in range(4)) / 4)
    assert len(set(round(own[r][0], 6) for r in range(4))) == 4  # the ranks' losses differ: a rank's own is caught
