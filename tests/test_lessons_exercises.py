"""The exercise checkers accept correct solutions and reject wrong ones with a precise message."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import check_basics
from ppkit.exercises.solutions import ring_all_reduce  # the one the notebook's learners are shown
from ppkit.lessons import data_parallel

# the workers cannot import this test module: ship its functions by value, as a notebook's are
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# -- solutions a learner might write ----------------------------------------------------------


def uses_all_reduce(rank, world_size, tensor):
    dist.all_reduce(tensor)
    return tensor


def forgets_own_values(rank, world_size, tensor):
    total = torch.zeros_like(tensor)
    for other in range(world_size):
        if other == rank:
            continue
        incoming = torch.empty_like(tensor)
        req = dist.isend(tensor, other)
        dist.recv(incoming, other)
        req.wait()
        total += incoming
    return total


def ring_shift(rank, world_size, tensor):
    incoming = torch.empty_like(tensor)
    req = dist.isend(tensor, (rank + 1) % world_size)
    dist.recv(incoming, (rank - 1) % world_size)
    req.wait()
    return incoming


def everyone_sends_first(rank, world_size, tensor):
    incoming = torch.empty_like(tensor)
    dist.send(tensor, (rank + 1) % world_size)
    dist.recv(incoming, (rank - 1) % world_size)
    return incoming


def swaps_with_partner(rank, world_size, tensor):  # right for 2 ranks only
    if rank > 1:
        return tensor
    incoming = torch.empty_like(tensor)
    req = dist.isend(tensor, 1 - rank)
    dist.recv(incoming, 1 - rank)
    req.wait()
    return incoming


def raises_on_rank_1(rank, world_size, tensor):
    if rank == 1:
        raise ValueError("oops on rank 1")
    return ring_shift(rank, world_size, tensor)


def _flat_average(model, divide=True):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    if divide:
        flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def bucketed_average(model):
    _flat_average(model)


def bucketed_sum(model):
    _flat_average(model, divide=False)


# -- ring all_reduce --------------------------------------------------------------------------

@pytest.mark.slow
def test_ring_all_reduce_passes_for_world_sizes_2_to_6(bare6, no_leftovers, capsys):
    report = check_basics.check_ring_all_reduce(ring_all_reduce, cluster=bare6)
    assert report.passed and len(report.cases) == 5
    assert "ring all_reduce: passed all 5 cases" in capsys.readouterr().out


@pytest.mark.slow
def test_ring_all_reduce_rejects_builtin_collectives(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_ring_all_reduce(uses_all_reduce, world_sizes=(2,), sizes=(3,), cluster=bare6)
    assert info.value.failures == [
        ("world_size 2: rank 0 raised ExerciseFailed: dist.all_reduce was called, but ring all_reduce "
         "must be built from send/recv (or isend/irecv) only. (rank(s) [1] raised the same)")]


@pytest.mark.slow
def test_ring_all_reduce_names_rank_index_and_values(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_ring_all_reduce(forgets_own_values, world_sizes=(3,), sizes=(7,), cluster=bare6)
    failures = info.value.failures
    assert len(failures) == 3  # one per rank
    want = sum(check_basics._reduce_input(r, 7, 0) for r in range(3))
    got = want - check_basics._reduce_input(2, 7, 0)
    i = int((got != want).nonzero()[0])
    assert failures[2].startswith(
        f"world_size 3, 7 element(s): rank 2 is wrong at {int((got != want).sum())} of 7 position(s); "
        f"first at index {i}: expected {want[i].item():g}, got {got[i].item():g}")
    assert failures[2].endswith("(exactly this rank's own values are missing from the sum)")
    assert "ring all_reduce: 3 problem(s) in 1 cases" in str(info.value)


# -- ring shift -------------------------------------------------------------------------------

@pytest.mark.slow
def test_ring_shift_passes(bare6, no_leftovers):
    assert check_basics.check_ring_shift(ring_shift, world_sizes=(2, 3, 5), cluster=bare6).passed


@pytest.mark.slow
def test_ring_shift_wrong_beyond_two_ranks(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_ring_shift(swaps_with_partner, world_sizes=(2, 3), sizes=(1,), cluster=bare6)
    assert info.value.failures == [
        ("world_size 3, 1 element(s): rank 0 is wrong at 1 of 1 position(s); first at index 0: expected "
         "200, got 100 (it should hold rank 2's tensor)"),
        ("world_size 3, 1 element(s): rank 2 is wrong at 1 of 1 position(s); first at index 0: expected "
         "100, got 200 (the tensor is unchanged: did the function return the tensor it worked on?) "
         "(it should hold rank 1's tensor)")]


@pytest.mark.slow
def test_ring_shift_deadlock_is_explained(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_ring_shift(everyone_sends_first, world_sizes=(2,), sizes=(1,), timeout=3, cluster=bare6)
    (failure,) = info.value.failures
    assert failure.startswith("world_size 2: did not finish within 3 s (rank 0 is blocked in dist.send, "
                              "called from everyone_sends_first() line")
    assert "Every rank is in dist.send and none has posted its recv" in failure


@pytest.mark.slow
def test_ring_shift_reports_an_exception_and_goes_on(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_ring_shift(raises_on_rank_1, world_sizes=(2, 3), sizes=(1,), timeout=10, cluster=bare6)
    first, second = info.value.failures
    assert first.startswith("world_size 2: rank 1 raised ValueError: oops on rank 1")
    assert second.startswith("world_size 3: rank 1 raised ValueError: oops on rank 1")


@pytest.mark.slow
def test_checker_runs_on_a_given_cluster_and_leaves_it_usable(no_leftovers):
    import ppkit

    with ppkit.Cluster(3, "gloo", process_group=False) as bare:
        with pytest.raises(ExerciseFailed, match="did not finish within 3 s"):
            check_basics.check_ring_shift(everyone_sends_first, world_sizes=(2,), sizes=(1,), timeout=3,
                                       cluster=bare)
        assert bare.state == "ready"
        assert check_basics.check_ring_shift(ring_shift, world_sizes=(2, 3), cluster=bare).passed
        assert bare.state == "ready"


@pytest.mark.slow
def test_checker_refuses_an_unsuitable_cluster(no_leftovers):
    import ppkit

    # this cluster has a process group, and too few ranks
    with ppkit.Cluster(2, "gloo") as with_group, pytest.raises(
            ConfigError, match="at least 3 ranks started without a process group"):
        check_basics.check_ring_shift(ring_shift, world_sizes=(2, 3), cluster=with_group)


def test_checker_refuses_a_non_function():
    with pytest.raises(ConfigError, match="pass your function itself"):
        check_basics.check_ring_shift(42)


# -- bucketed averaging -----------------------------------------------------------------------

@pytest.mark.slow
def test_bucketed_average_passes(bare6, no_leftovers):
    assert check_basics.check_bucketed_average(bucketed_average, cluster=bare6).passed


@pytest.mark.slow
def test_bucketed_average_finds_missing_division(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_bucketed_average(bucketed_sum, world_sizes=(3,), cluster=bare6)
    failures = info.value.failures
    assert len(failures) == 3 * 4  # 3 ranks x 4 parameters
    assert failures[0].startswith("world_size 3: rank 0, gradient of '0.weight' differs from the "
                                  "whole-batch gradient by up to")
    assert failures[0].endswith("(it is 3 times too large: summed but not divided by world_size)")


@pytest.mark.slow
def test_bucketed_average_wants_a_single_all_reduce(bare6, no_leftovers):
    with pytest.raises(ExerciseFailed) as info:
        check_basics.check_bucketed_average(data_parallel.average_gradients, world_sizes=(2,), cluster=bare6)
    assert info.value.failures == [
        f"world_size 2: rank {r} called dist.all_reduce 4 times (on [64, 16, 48, 3] elements); the "
        "exercise asks for one call on one flat tensor that holds every gradient (torch.cat of the "
        "flattened grads)" for r in (0, 1)]
