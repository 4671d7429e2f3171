"""The checkers of notebooks 09 and 10 pass the solutions, say which rank got what wrong, and
report an unwritten stub without failing."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import ppkit
from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_sharding as ex
from ppkit.exercises import solutions as sharding_solutions

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def bare():
    with ppkit.Cluster(4, "gloo", process_group=False, timeout=30) as cluster:
        yield cluster


def stub_zero2(grad, rank, world_size):
    raise NotImplementedError("write ZeRO-2's gradient step here")


def stub_row(x_part, weight_part, bias):
    raise NotImplementedError("write the row-parallel forward here")


def sums_without_dividing(grad, rank, world_size):
    shard = torch.empty(grad.numel() // world_size)
    dist.reduce_scatter_tensor(shard, grad)
    return shard


def all_reduce_then_slice(grad, rank, world_size):
    dist.all_reduce(grad)
    size = grad.numel() // world_size
    return grad[rank * size:(rank + 1) * size] / world_size


def wrong_slice(grad, rank, world_size):
    shard = torch.empty(grad.numel() // world_size)
    dist.reduce_scatter_tensor(shard, grad.roll(grad.numel() // world_size))
    return shard / world_size


def rank1_keeps_own(grad, rank, world_size):
    shard = sharding_solutions.zero2_grad_shard(grad.clone(), rank, world_size)
    size = grad.numel() // world_size
    return grad[rank * size:(rank + 1) * size] if rank == 1 else shard


def bias_every_rank(x_part, weight_part, bias):
    y = x_part @ weight_part.T + bias
    dist.all_reduce(y)
    return y


def no_all_reduce(x_part, weight_part, bias):
    return x_part @ weight_part.T + bias


def test_solutions_pass(bare, capsys):
    report = ex.check_zero2_grad_shard(sharding_solutions.zero2_grad_shard, cluster=bare)
    assert report.passed and len(report.cases) == 3
    report = ex.check_row_parallel_forward(sharding_solutions.row_parallel_forward, cluster=bare)
    assert report.passed and len(report.cases) == 3
    assert "passed all 3 cases" in capsys.readouterr().out


def test_stubs_are_not_written_yet_not_failures(bare, capsys):
    assert ex.check_zero2_grad_shard(stub_zero2, cluster=bare) is None
    assert ex.check_row_parallel_forward(stub_row, cluster=bare) is None
    out = capsys.readouterr().out
    assert "not written yet: replace the NotImplementedError in stub_zero2" in out
    assert "not written yet: replace the NotImplementedError in stub_row" in out


@pytest.mark.parametrize("check, fn, says", [
    (ex.check_zero2_grad_shard, sums_without_dividing,
     "world_size 2, 12 gradient values: rank 0 holds the sum, 2 times too large"),
    (ex.check_zero2_grad_shard, all_reduce_then_slice, "rank 0 called dist.all_reduce 1 time(s)"),
    (ex.check_zero2_grad_shard, wrong_slice, "holds rank 1's slice; slice r of the flat gradient belongs to rank r"),
    (ex.check_zero2_grad_shard, rank1_keeps_own,
     "world_size 3, 12 gradient values: rank 1 holds only its own gradient's slice"),
    (ex.check_row_parallel_forward, bias_every_rank, "world_size 3: rank 0's output holds the bias 3 times"),
    (ex.check_row_parallel_forward, no_all_reduce, "world_size 2: rank 1 returned only its own partial product"),
])
@pytest.mark.slow
def test_mistakes_name_the_rank_and_the_mistake(bare, check, fn, says):
    with pytest.raises(ExerciseFailed) as info:
        check(fn, cluster=bare)
    assert says in str(info.value), str(info.value)


def test_only_the_wrong_rank_is_named(bare):
    with pytest.raises(ExerciseFailed) as info:
        ex.check_zero2_grad_shard(rank1_keeps_own, cluster=bare)
    assert info.value.failures and all("rank 1 " in f for f in info.value.failures), info.value.failures


def test_a_raising_rank_is_reported(bare):
    def breaks_on_rank_2(x_part, weight_part, bias):
        if dist.get_rank() == 2:
            raise ValueError("rank 2 gave up")
        return sharding_solutions.row_parallel_forward(x_part, weight_part, bias)
    with pytest.raises(ExerciseFailed, match="world_size 3: rank 2 raised ValueError: rank 2 gave up"):
        ex.check_row_parallel_forward(breaks_on_rank_2, cluster=bare, timeout=10)
