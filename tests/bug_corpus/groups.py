"""Process groups: the order of groups, a group that only some ranks make, a destroyed group's successor."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.bug_corpus.truth import CORRECT, Truth, program

DOCTOR_REVIEW = "the doctor's review (a learner's cell, run in a real kernel)"


@program(2, Truth("group_order", ranks=(0, 1), op="all_reduce", accept=("missing",)), DOCTOR_REVIEW +
         ": two groups over the same ranks, called in opposite orders", quick=True)
def groups_in_opposite_order(rank, world_size):
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    first, second = (a, b) if rank == 0 else (b, a)
    dist.all_reduce(torch.ones(2), group=first)
    dist.all_reduce(torch.ones(2), group=second)


@program(4, CORRECT, "the course's 2x2 mesh: each pair all_reduces in its own group", quick=True)
def pair_groups_correct(rank, world_size):
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    t = torch.ones(2) * rank
    dist.all_reduce(t, group=pairs[rank // 2])
    return t.tolist()


@program(2, Truth("missing", ranks=(1,), op="all_reduce", seq=1, group_ranks=(0, 1)), DOCTOR_REVIEW +
         ": persistent workers, a first job's group destroyed, a second group where rank 1 never calls")
def destroyed_group_then_hang(rank, world_size):
    first = dist.new_group([0, 1])
    for _ in range(30):
        dist.all_reduce(torch.ones(2), group=first)
    dist.destroy_process_group(first)
    second = dist.new_group([0, 1])
    if rank == 0:
        dist.all_reduce(torch.ones(2), group=second)


@program(2, CORRECT, DOCTOR_REVIEW + ": async all_reduces on two groups, each rank computing between them",
         timeout=30)
def async_two_groups_overlap(rank, world_size):
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    wa = dist.all_reduce(torch.ones(4), group=a, async_op=True)
    time.sleep(3 if rank == 0 else 0.1)
    wb = dist.all_reduce(torch.ones(4), group=b, async_op=True)
    wa.wait()
    wb.wait()


@program(4, Truth("missing", ranks=(2, 3), op="all_reduce", seq=2, group_ranks=(0, 1, 2, 3)), "a learner's "
         "subgroup code where ranks 2-3 skip a world all_reduce after their own group's")
def subgroup_then_world_skip(rank, world_size):
    pair = dist.new_group([0, 1])
    other = dist.new_group([2, 3])
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(2), group=pair if rank < 2 else other)
    if rank < 2:
        dist.all_reduce(torch.ones(2))


@program(4, Truth("wrong_group", ranks=(0, 1, 2, 3), op="all_reduce", visible=()), "a dp all_reduce over the "
         "WORLD group in a dp2 x tp2 run (completes; only the data is wrong)")
def dp_allreduce_over_world(rank, world_size):
    t = torch.ones(2) * rank
    dist.all_reduce(t)  # should be the dp group [rank % 2, rank % 2 + 2]
    return t.tolist()


@program(3, CORRECT, "torch's new_subgroups (each rank in one subgroup), all_reduce in it")
def new_subgroups_correct(rank, world_size):
    group, _ = dist.new_subgroups(group_size=1)
    t = torch.ones(2)
    dist.all_reduce(t, group=group)
    dist.barrier()
    return t.tolist()


@program(3, Truth("group_order", ranks=(2,), accept=("missing",)), "a hostile review of the doctor's records: rank "
         "2 creates new_group([1, 2]) before new_group([0, 1]), ranks 0-1 the other way round (torch names groups by "
         "a counter), then ranks 1-2 all_reduce on [1, 2]")
def subgroups_created_in_a_different_order(rank, world_size):
    if rank == 2:
        b, _ = dist.new_group([1, 2]), dist.new_group([0, 1])
    else:
        _, b = dist.new_group([0, 1]), dist.new_group([1, 2])
    if rank in (1, 2):
        dist.all_reduce(torch.ones(2), group=b)
    dist.barrier()
