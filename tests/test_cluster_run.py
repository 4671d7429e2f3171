"""cluster.run as a learner uses it: results by rank, functions from notebook cells, rank prints."""

from __future__ import annotations

import functools
import os
import sys

import pytest
import torch

# Seed 001's functions, pasted as a learner would paste them into a notebook cell (verbatim, Chinese
# comments included). They take (rank, size), the calling convention cluster.run uses.
SEED_001_CELL = '''
import os
import torch
import torch.distributed as dist

def test_send_recv_sync(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1) # 需要指定dst,发送的目标
    else:
        dist.recv(tensor=tensor, src=0) # 需要指定src,从哪儿接收
    print('Rank ', rank, ' has data ', tensor[0])

# 异步
def test_send_recv_async(rank, size):
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
    else:
        req = dist.irecv(tensor=tensor, src=0)
    req.wait()
    print('Rank ', rank, ' has data ', tensor[0])

def test_broadcast(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
      tensor += 2
    else:
      tensor += 1
    dist.broadcast(tensor=tensor,src=0) # src指定broad_cast的源
    print("******test_broadcast******")
    print('Rank ', rank, ' has data ', tensor) # 结果都是 2

def test_scatter(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
      tensor_list = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0]), torch.tensor([4.0])]
      dist.scatter(tensor, scatter_list = tensor_list, src = 0)
    else:
      dist.scatter(tensor, scatter_list = [], src = 0)
    print("******test_scatter******")
    print('Rank ', rank, ' has data ', tensor) # 结果是[[1], [2], [3], [4]]

def test_reduce(rank, size):
    tensor = torch.ones(1)
    dist.reduce(tensor=tensor, dst=0) # dst指定哪个进程进行reduce, 默认操作是加法
    print("******test_reduce******")
    print('Rank ', rank, ' has data ', tensor)

def test_all_reduce(rank, size):
    tensor = torch.ones(1)
    dist.all_reduce(tensor=tensor,op=dist.ReduceOp.SUM)
    print("******test_all_reduce******")
    print('Rank ', rank, ' has data ', tensor)  # 结果都是 4

def test_gather(rank, size):
    tensor = torch.ones(1)
    if rank == 0:
      output = [torch.zeros(1) for _ in range(size)]
      dist.gather(tensor, gather_list=output, dst=0)
    else:
      dist.gather(tensor, gather_list=[], dst=0)
    if rank == 0:
      print("******test_gather******")
      print('Rank ', rank, ' has data ', output)  # 结果是 [[1,1,1,1]]

def test_all_gather(rank, size):
    output = [torch.zeros(1) for _ in range(size)]
    tensor = torch.ones(1)
    dist.all_gather(output, tensor)
    print("******test_all_gather******")
    print('Rank ', rank, ' has data ', output)  # 结果都是 [1,1,1,1]
'''


@pytest.fixture(scope="module")
def seed_cell() -> dict:
    """The namespace a notebook cell holding seed 001's code would leave behind (module __main__)."""
    namespace = {"__name__": "__main__"}
    exec(compile(SEED_001_CELL, "<notebook cell>", "exec"), namespace)  # noqa: S102 - what a cell does
    return namespace


def lines_of(text: str) -> set[str]:
    return set(text.splitlines())


# -- results and calling convention ----------------------------------------------------------------
def test_run_returns_one_result_per_rank_in_rank_order(cluster4):
    assert cluster4.run(lambda rank, world_size: (rank, world_size)) == [(0, 4), (1, 4), (2, 4), (3, 4)]


def test_run_passes_args_and_kwargs_after_rank_and_world_size(cluster2):
    def scaled(rank, world_size, base, *, scale=1):
        return (base + rank) * scale

    assert cluster2.run(scaled, 10, scale=3) == [30, 33]


def test_functions_defined_in_a_cell_run_by_value(cluster2):
    # Everything here exists only in this test's frame, like names defined in a notebook cell:
    # mp.spawn could not pickle them by reference, cluster.run ships them by value.
    offset = 100

    def helper(x):
        return x * 2

    class Point:
        def __init__(self, x):
            self.x = x

    def closure(rank, world_size):
        return helper(rank) + offset

    def make_point(rank, world_size):
        return Point(rank)

    assert cluster2.run(closure) == [100, 102]
    assert cluster2.run(lambda rank, world_size: rank ** 2 + world_size) == [2, 3]
    assert cluster2.run(functools.partial(lambda rank, world_size, k: rank * k, k=7)) == [0, 7]
    assert [p.x for p in cluster2.run(make_point)] == [0, 1]


def test_tensors_go_both_ways(cluster2):
    def all_reduce_plus(rank, world_size, t):
        import torch.distributed as dist

        t = t + rank
        dist.all_reduce(t)
        return t

    out = cluster2.run(all_reduce_plus, torch.arange(3.0))
    # rank 0 contributes [0,1,2], rank 1 contributes [1,2,3]
    for t in out:
        assert torch.equal(t, torch.tensor([1.0, 3.0, 5.0]))


def test_a_function_that_returns_nothing_gives_none_per_rank(cluster2):
    assert cluster2.run(lambda rank, world_size: None) == [None, None]


# -- seed 001, unchanged ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["test_send_recv_sync", "test_send_recv_async"])
def test_seed_001_point_to_point_runs_unchanged(cluster2, seed_cell, capsys, name):
    assert cluster2.run(seed_cell[name]) == [None, None]
    out = lines_of(capsys.readouterr().out)
    assert {"[rank 0] Rank  0  has data  tensor(1.)", "[rank 1] Rank  1  has data  tensor(1.)"} <= out


@pytest.mark.parametrize("name, expected", [
    ("test_broadcast", ["tensor([2.])"] * 4),
    ("test_scatter", ["tensor([1.])", "tensor([2.])", "tensor([3.])", "tensor([4.])"]),
    ("test_all_reduce", ["tensor([4.])"] * 4),
    ("test_reduce", ["tensor([4.])", None, None, None]),  # only the destination's value is defined
    ("test_all_gather", ["[tensor([1.]), tensor([1.]), tensor([1.]), tensor([1.])]"] * 4),
    ("test_gather", ["[tensor([1.]), tensor([1.]), tensor([1.]), tensor([1.])]", None, None, None]),
])
@pytest.mark.slow
def test_seed_001_collectives_run_unchanged(cluster4, seed_cell, capsys, name, expected):
    assert cluster4.run(seed_cell[name]) == [None] * 4
    out = lines_of(capsys.readouterr().out)
    for rank, value in enumerate(expected):
        if value is not None:
            assert f"[rank {rank}] Rank  {rank}  has data  {value}" in out, out


# -- what ranks print ------------------------------------------------------------------------------
def test_each_rank_prints_with_a_rank_prefix(cluster2, capsys):
    def chatty(rank, world_size):
        print(f"hello from rank {rank} of {world_size}")
        print("two\nlines")
        print("to stderr", file=sys.stderr)
        os.write(1, f"raw fd write {rank}\n".encode())  # what C++ code printing to stdout does
        print("no newline at the end", end="")
        return rank

    assert cluster2.run(chatty) == [0, 1]
    captured = capsys.readouterr()
    out, err = lines_of(captured.out), lines_of(captured.err)
    for rank in (0, 1):
        assert f"[rank {rank}] hello from rank {rank} of 2" in out
        assert f"[rank {rank}] two" in out and f"[rank {rank}] lines" in out
        assert f"[rank {rank}] raw fd write {rank}" in out
        assert f"[rank {rank}] no newline at the end" in out
        assert f"[rank {rank}] to stderr" in err
    assert all(line.startswith("[rank ") for line in out | err if line)


def test_prints_arrive_before_run_returns(cluster2, capsys):
    def many_lines(rank, world_size):
        for i in range(200):
            print(f"line {i}")

    cluster2.run(many_lines)
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        mine = [line for line in out if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] line {i}" for i in range(200)]


def test_runs_from_two_threads_take_turns(fresh):
    """A widget's callback may run on another kernel thread (JupyterLab's subshells) while a cell's
    job runs: the two jobs must not mix their ranks' results."""
    import threading
    import time

    def slow(rank, world_size, tag):
        time.sleep(0.3)
        return (tag, rank)

    results = {}
    threads = [threading.Thread(target=lambda t=tag: results.__setitem__(t, fresh.run(slow, t))) for tag in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {"a": [("a", 0), ("a", 1)], "b": [("b", 0), ("b", 1)]}
