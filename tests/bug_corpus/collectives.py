"""Collectives: ranks that disagree on a collective (op, size, dtype), skip one, or run correct loops."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.bug_corpus.truth import CORRECT, Truth, program

DOCTOR_REVIEW = "the doctor's review (a learner's cell, run in a real kernel)"
TORCH_DDP_TESTS = "torch/testing/_internal/distributed/distributed_test.py"


@program(2, CORRECT, "the docs' all_reduce example", quick=True)
def allreduce_loop_correct(rank, world_size):
    t = torch.ones(4)
    for _ in range(20):
        dist.all_reduce(t)
    return t.tolist()


@program(2, Truth("size_mismatch", ranks=(1,), op="all_reduce", seq=1), "docs/debugging.md's shapes_differ; "
         "https://github.com/NVIDIA/nccl/issues/1394 (all_reduce of [100, 2560] against [200, 2560])", quick=True)
def allreduce_sizes_differ(rank, world_size):
    t = torch.ones(3 if rank == 0 else 4)
    dist.all_reduce(t)


@program(2, Truth("dtype_mismatch", ranks=(1,), op="all_reduce", seq=1), DOCTOR_REVIEW)
def allreduce_dtypes_differ(rank, world_size):
    t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    dist.all_reduce(t)


@program(2, Truth("op_mismatch", ranks=(1,), op="broadcast", seq=1), DOCTOR_REVIEW + ": all_reduce against "
         "broadcast", quick=True)
def allreduce_against_broadcast(rank, world_size):
    t = torch.ones(4)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


@program(2, Truth("op_mismatch", ranks=(1,), op="barrier", seq=1), TORCH_DDP_TESTS +
         "::test_monitored_barrier_allreduce_hang (a barrier on one rank, an all_reduce on the other)")
def barrier_against_allreduce(rank, world_size):
    if rank == 0:
        dist.all_reduce(torch.ones(2))
    else:
        dist.barrier()


@program(2, Truth("missing", ranks=(1,), op="all_reduce", seq=2), DOCTOR_REVIEW + ": rank 1 returns before "
         "the second all_reduce", quick=True)
def rank_skips_second_allreduce(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        return
    dist.all_reduce(t)


@program(3, Truth("missing", ranks=(2,), op="all_reduce", seq=4),
         "a collective under an if that one rank's data decides (the hang described in https://github.com/pytorch/pytorch/issues/33148)")
def allreduce_under_data_dependent_if(rank, world_size):
    for step in range(5):
        loss = torch.tensor(float(step + rank))
        if loss < 5:  # rank 2's loss reaches 5 at step 3: it skips the all_reduce
            dist.all_reduce(loss)


@program(2, Truth("missing", ranks=(1,), op="all_reduce", seq=2), DOCTOR_REVIEW + ": a harmless size difference "
         "([4] against [2, 2], correct data) and, later, a rank that never reaches an all_reduce", quick=True)
def harmless_difference_then_hang(rank, world_size):
    t = torch.ones(4) if rank == 0 else torch.ones(2, 2)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(torch.ones(3))


@program(2, Truth("missing", ranks=(1,), op="all_reduce", seq=1), DOCTOR_REVIEW + ": 20 async all_reduces in "
         "flight on rank 0 while rank 1 waits in recv")
def many_in_flight_against_recv(rank, world_size):
    if rank == 0:
        works = [dist.all_reduce(torch.ones(2), async_op=True) for _ in range(20)]
        for work in works:
            work.wait()
    else:
        dist.recv(torch.empty(2), src=0)


@program(4, Truth("size_mismatch", ranks=(3,), op="reduce_scatter_tensor", seq=1, accept=("missing",)),
         DOCTOR_REVIEW + ": a 4-rank reduce_scatter_tensor with a wrong size on rank 3 (gloo's check of rank 3's "
         "sizes raises before the call reaches the backend: rank 3 never enters collective #1 either)")
def reduce_scatter_tensor_wrong_size(rank, world_size):
    out = torch.empty(2)
    inp = torch.ones(8 if rank != 3 else 12)
    dist.reduce_scatter_tensor(out, inp)


@program(2, Truth("missing", ranks=(1,), op="reduce_scatter", seq=2), DOCTOR_REVIEW + ": gloo records "
         "reduce_scatter (list form) as two all_reduces")
def reduce_scatter_list_then_skip(rank, world_size):
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.ones(2) for _ in range(world_size)])
    if rank == 0:
        dist.reduce_scatter(out, [torch.ones(2) for _ in range(world_size)])


@program(2, Truth("reduce_op_mismatch", ranks=(1,), op="all_reduce", seq=1, visible=("doctor",)), DOCTOR_REVIEW +
         ": SUM on one rank, MAX on the other (it completes; the record keeps each rank's reduce op, so the doctor "
         "can name it when asked)")
def sum_against_max(rank, world_size):
    t = torch.tensor([1.0, 2.0]) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX)
    return t.tolist()


@program(2, Truth("src_mismatch", ranks=(1,), op="reduce", seq=1, visible=("doctor",)),
         "https://github.com/pytorch/pytorch/issues/39706 (reduce with a different dst on each rank; on gloo it "
         "hangs; the record keeps each rank's dst)")
def reduce_dst_differs(rank, world_size):
    t = torch.ones(3)
    dist.reduce(t, dst=rank)
    return t.tolist()


@program(2, Truth("size_mismatch", ranks=(1,), op="all_gather", seq=1, accept=("missing",)), "a learner's "
         "all_gather of uneven pieces (gloo requires equal sizes; cf. https://github.com/NVIDIA/nccl/issues/1394; "
         "gloo's check of rank 1's sizes raises before the call reaches the backend: rank 1 never enters it)")
def all_gather_uneven(rank, world_size):
    t = torch.ones(2 + rank)
    out = [torch.empty(2) for _ in range(world_size)]
    dist.all_gather(out, t)


@program(2, Truth("size_mismatch", ranks=(0, 1), op="all_to_all_single", seq=1), "a learner's all_to_all_single "
         "whose output split sizes disagree with the senders'")
def all_to_all_splits_disagree(rank, world_size):
    inp = torch.ones(4)
    out = torch.empty(4 if rank == 0 else 5)
    splits_out = [2, 2] if rank == 0 else [2, 3]
    dist.all_to_all_single(out, inp, output_split_sizes=splits_out, input_split_sizes=[2, 2])


@program(2, CORRECT, DOCTOR_REVIEW + ": a long loop of small all_reduces, still making progress under load",
         timeout=60)
def many_allreduces_progress(rank, world_size):
    t = torch.ones(2)
    for _ in range(6000):
        dist.all_reduce(t)
        t.fill_(1.0)


@program(2, CORRECT, DOCTOR_REVIEW + ": one rank computes for seconds while the other already waits",
         timeout=30, quick=True)
def slow_rank_then_allreduce(rank, world_size):
    if rank == 0:
        time.sleep(4)
    t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist()


@program(4, CORRECT, "the course's scatter of per-rank values (notebook 02)")
def scatter_correct(rank, world_size):
    out = torch.empty(1)
    chunks = [torch.tensor([10.0 * (r + 1)]) for r in range(world_size)] if rank == 0 else None
    dist.scatter(out, chunks, src=0)
    return out.item()


@program(2, Truth("missing", ranks=(1,), op="all_reduce", seq=1), "a rank that raises before its collective "
         "(torch's ProcessGroup tests: an error on one rank)", quick=True)
def rank_raises_before_allreduce(rank, world_size):
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(2))


@program(2, Truth("not_collective", ranks=(1,), visible=()), "a rank that raises after every collective: "
         "not a collective bug")
def rank_raises_after_collectives(rank, world_size):
    dist.all_reduce(torch.ones(2))
    if rank == 1:
        raise ValueError("rank 1's own check failed")


@program(2, CORRECT, "the tutorials' all_reduce of a loss for logging, async with compute between")
def async_allreduce_overlap(rank, world_size):
    t = torch.ones(1000)
    work = dist.all_reduce(t, async_op=True)
    time.sleep(3)
    work.wait()
    return t[0].item()


@program(2, Truth("missing", ranks=(1,), op="broadcast", seq=3), DOCTOR_REVIEW + ": an evaluation broadcast "
         "only rank 0 makes, after a few correct steps")
def eval_broadcast_only_rank0(rank, world_size):
    for _ in range(2):
        dist.all_reduce(torch.ones(2))
    if rank == 0:
        dist.broadcast(torch.ones(2), src=0)


REVIEW_A = "a hostile review of the doctor's records (a learner's program, not in the tests)"


@program(2, CORRECT, REVIEW_A + ": a DTensor Shard(0) -> Replicate redistribute (funcol's all_gather_into_tensor, "
         "which torch's matcher flags on its own as gloo records it)")
def dtensor_redistribute_correct(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    return distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]).redistribute(mesh, [Replicate()]).to_local().tolist()


@program(3, Truth("op_mismatch", ranks=(2,), op="all_reduce", seq=1), REVIEW_A + ": ranks 0-1 call reduce_scatter "
         "(list form), rank 2 all_reduce: gloo records all_reduces on every rank")
def reduce_scatter_list_against_all_reduce(rank, world_size):
    out = torch.zeros(2)
    if rank < 2:
        dist.reduce_scatter(out, [torch.ones(2) for _ in range(world_size)])
    else:
        dist.all_reduce(out)
    dist.barrier()


@program(2, Truth("missing", ranks=(1,), op="all_reduce", seq=1), REVIEW_A + ": funcol's all_reduce on rank 0 "
         "(no Python record of the call), rank 1 in a recv")
def funcol_all_reduce_against_recv(rank, world_size):
    import torch.distributed._functional_collectives as funcol

    if rank == 0:
        y = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
        return y.sum().item()
    dist.recv(torch.zeros(1), src=0)
