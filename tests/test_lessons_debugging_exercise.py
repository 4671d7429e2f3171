"""The checker of notebook 02's debugging exercise (the mean loss over ranks holding different numbers of
losses) passes the solution and names each plausible mistake: a skipped collective, mismatched shapes or
dtypes (caught by the sub-worlds' DETAIL check, not left to hang), a hang, a rank's exception, wrong means."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import ppkit
from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_debugging as ex
from ppkit.exercises import solutions

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def bare():
    with ppkit.Cluster(4, "gloo", process_group=False, timeout=30) as cluster:
        yield cluster


def failures(fn, bare, **options) -> list[str]:
    with pytest.raises(ExerciseFailed) as info:
        ex.check_mean_loss(fn, cluster=bare, **options)
    assert bare.state == "ready"  # handed back usable
    return list(info.value.failures)


# -- what a learner might write ------------------------------------------------------------------

def skips_when_empty(rank, world_size, losses):
    if not losses:
        return 0.0  # nothing to add, so no all_reduce: the others wait for this rank
    total = torch.tensor([sum(losses), len(losses)], dtype=torch.float64)
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def reduces_the_list(rank, world_size, losses):
    t = torch.tensor(losses)
    dist.all_reduce(t)
    return t.sum().item() / (len(losses) * world_size)


def int_for_an_empty_rank(rank, world_size, losses):
    total = torch.tensor([sum(losses), len(losses)])  # sum([]) is the int 0: an int64 tensor there
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def mean_of_means(rank, world_size, losses):
    mean = torch.tensor(losses).mean()
    dist.all_reduce(mean)
    return (mean / world_size).item()


def mean_of_means_zero_if_empty(rank, world_size, losses):
    mean = torch.tensor(sum(losses) / len(losses) if losses else 0.0)
    dist.all_reduce(mean)
    return (mean / world_size).item()


def own_mean(rank, world_size, losses):
    return sum(losses) / len(losses) if losses else 0.0


def divides_by_world_size(rank, world_size, losses):
    total = torch.tensor([float(sum(losses))])
    dist.all_reduce(total)
    return (total / world_size).item()


def returns_the_tensor(rank, world_size, losses):
    total = torch.tensor([sum(losses), len(losses)], dtype=torch.float64)
    dist.all_reduce(total)
    return total


def divides_by_zero(rank, world_size, losses):
    mean = torch.tensor(sum(losses) / len(losses))
    dist.all_reduce(mean)
    return (mean / world_size).item()


def waits_for_a_send(rank, world_size, losses):
    if rank == 0:
        dist.recv(torch.zeros(1), src=1)  # no rank ever sends it
    return solutions.mean_loss(rank, world_size, losses)


def half_written(rank, world_size, losses):
    raise NotImplementedError("replace this line with your code")


# -- the checks ----------------------------------------------------------------------------------

def test_the_solution_passes_every_case(bare, capsys):
    report = ex.check_mean_loss(solutions.mean_loss, cluster=bare)
    assert report.passed and len(report.cases) == 9
    assert "world_size 4, losses per rank [1, 2, 3, 0]" in report.cases
    assert capsys.readouterr().out.startswith("mean loss: passed all 9 cases")


def test_the_cases_hold_uneven_and_empty_lists_whose_mean_of_means_is_wrong():
    for k in ex.WORLD_SIZES:
        even, uneven, one_empty = ex.loss_counts(k)
        assert len(set(even)) == 1 and len(set(uneven)) == k and one_empty[-1] == 0
        lists = [ex.rank_losses(r, c) for r, c in enumerate(uneven)]
        mean = sum(map(sum, lists)) / sum(map(len, lists))
        assert abs(mean - sum(sum(v) / len(v) for v in lists) / k) > 0.05  # the mean of means is caught


def test_a_function_still_raising_not_implemented_is_not_written(bare, capsys):
    assert ex.check_mean_loss(half_written, cluster=bare) is None
    assert "not written yet" in capsys.readouterr().out


def test_a_rank_that_skips_the_collective_is_named(bare):
    assert failures(skips_when_empty, bare) == [
        f"world_size {k}, losses per rank {ex.loss_counts(k)[2]}: rank(s) [{k - 1}] returned from the function while "
        f"rank(s) {list(range(k - 1))} were still in ALLREDUCE (rank {k - 1}: 0 losses): every rank must make the "
        "same collective calls, a rank with no losses too (it adds zeros). TORCH_DISTRIBUTED_DEBUG=DETAIL caught it; "
        "without it this is a hang" for k in ex.WORLD_SIZES]


def test_ranks_reducing_lists_of_different_lengths_are_named_with_their_shapes(bare):
    found = failures(reduces_the_list, bare, world_sizes=(3,))
    assert found[0].startswith("world_size 3, losses per rank [4, 3, 2]: the ranks called ALLREDUCE with tensors of "
                               "different shapes (rank 0 [4], ")
    assert "reduce a fixed-size summary (the sum and the count)" in found[0]
    assert len(found) == 1  # the group is out of step after a mismatch: the later cases are not reported


def test_an_integer_tensor_on_the_empty_rank_is_named(bare):
    [found] = failures(int_for_an_empty_rank, bare, world_sizes=(2,))
    assert found.startswith("world_size 2, losses per rank [1, 0]: the ranks called ALLREDUCE with tensors of "
                            "different dtypes (rank 0 Float, rank 1 Long): sum([]) is the int 0")


def test_the_mean_of_means_and_its_nan_are_named(bare):
    found = failures(mean_of_means, bare, world_sizes=(2,))
    assert found == [
        "world_size 2, losses per rank [3, 2]: rank(s) [0, 1] returned 0.71875, the mean of the ranks' own means; "
        "the mean of every loss is 0.625: a rank with few losses weighs as much as one with many. Add up the sums "
        "and the counts over the ranks, then divide",
        "world_size 2, losses per rank [1, 0]: rank(s) [0, 1] returned nan: a rank with no losses took the mean of "
        "an empty list (0 / 0), and a collective spread it to every rank. Count the losses instead of averaging them "
        "on each rank (the mean is 0.125)"]
    zero = failures(mean_of_means_zero_if_empty, bare, world_sizes=(2,))
    assert "the mean of the ranks' own means, 0 for a rank with none" in zero[-1]


@pytest.mark.parametrize("fn, named", [
    (own_mean, "returned its own mean (0.1875 on the first): nothing came from the other ranks"),
    (divides_by_world_size, "the sum divided by world_size (2), not by the number of losses (4)"),
    (returns_the_tensor, "returned Tensor tensor([2.7500, 4.0000], dtype=torch.float64), not a number"),
])
def test_wrong_numbers_are_named(bare, fn, named):
    found = failures(fn, bare, world_sizes=(2,))
    assert found[0].startswith("world_size 2, losses per rank [2, 2]: rank(s) [0")
    assert named in found[0], found


@pytest.mark.slow
def test_an_exception_on_the_empty_rank_names_that_rank(bare):
    assert failures(divides_by_zero, bare, world_sizes=(2,)) == [
        "world_size 2: rank 1 raised ZeroDivisionError: division by zero (rank(s) [0] failed too)"]


@pytest.mark.slow
def test_a_hang_is_named_within_the_timeout_and_leaves_the_cluster_usable(bare):
    [found] = failures(waits_for_a_send, bare, world_sizes=(2,), timeout=2)
    assert found.startswith("world_size 2: did not finish within 2 s (rank 0 ")
    assert ex.check_mean_loss(solutions.mean_loss, cluster=bare, world_sizes=(2,)).passed


def test_the_ranks_debug_level_is_off_again_after_a_check(bare):
    failures(reduces_the_list, bare, world_sizes=(2,))
    assert bare.run(lambda rank, world_size: str(dist.get_debug_level())) == ["DebugLevel.OFF"] * 4
