"""Point to point: send/recv pairs, rings, tags, wrong peers, and correct overlap."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.bug_corpus.truth import CORRECT, Truth, program

RECV_DEADLOCK = "https://runebook.dev/en/articles/pytorch/distributed/torch.distributed.recv (both ranks recv first)"
DOCTOR_REVIEW = "the doctor's review (a learner's cell, run in a real kernel)"


@program(2, CORRECT, "the p2p tutorial's ping-pong (notebook 04)", quick=True)
def ping_pong_correct(rank, world_size):
    t = torch.zeros(3)
    for _ in range(5):
        if rank == 0:
            dist.send(t + 1, dst=1)
            dist.recv(t, src=1)
        else:
            dist.recv(t, src=0)
            dist.send(t + 1, dst=0)
    return t.tolist()


@program(2, Truth("p2p_deadlock", ranks=(0, 1), op="recv"), RECV_DEADLOCK, quick=True)
def both_recv_first(rank, world_size):
    t = torch.zeros(3)
    dist.recv(t, src=1 - rank)
    dist.send(t, dst=1 - rank)


@program(3, Truth("p2p_deadlock", ranks=(0, 1, 2), op="recv"), DOCTOR_REVIEW + ": a 3-rank ring where every "
         "rank receives first")
def ring_all_recv_first(rank, world_size):
    t = torch.zeros(2)
    dist.recv(t, src=(rank - 1) % world_size)
    dist.send(t, dst=(rank + 1) % world_size)


@program(3, CORRECT, "torch's batch_isend_irecv ring (distributed_test.py::test_batch_isend_irecv_ring_exchange_nccl, "
         "on gloo)")
def batch_ring_correct(rank, world_size):
    send, recv = torch.full((2,), float(rank)), torch.zeros(2)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world_size), dist.P2POp(dist.irecv, recv, (rank - 1) % world_size)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return recv.tolist()


@program(2, Truth("p2p_unmatched", ranks=(0, 1), op="recv", accept=("p2p_deadlock",)), DOCTOR_REVIEW + ": isend "
         "with tag 1 against irecv with tag 2 (each rank's wait needs the other's matching call: a cycle of two waits)")
def tags_differ(rank, world_size):
    t = torch.zeros(2)
    if rank == 0:
        dist.isend(t, dst=1, tag=1).wait()
    else:
        dist.irecv(t, src=0, tag=2).wait()


@program(2, CORRECT, DOCTOR_REVIEW + ": isend, seconds of compute, then recv (valid overlap)", timeout=30,
         quick=True)
def isend_compute_recv(rank, world_size):
    out, got = torch.full((2,), float(rank)), torch.zeros(2)
    work = dist.isend(out, dst=1 - rank)
    time.sleep(4)
    dist.recv(got, src=1 - rank)
    work.wait()
    return got.tolist()


@program(3, Truth("p2p_unmatched", ranks=(1,), op="recv"), "a learner's ring that receives from the wrong rank")
def recv_from_wrong_peer(rank, world_size):
    t = torch.zeros(2)
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=2)  # the mistake: rank 0 sends to it, rank 2 never does


@program(2, Truth("p2p_unmatched", ranks=(0,), op="send"), "a rank that returns before the send its peer waits for")
def sender_returns_early(rank, world_size):
    t = torch.zeros(2)
    if rank == 1:
        dist.recv(t, src=0)


@program(2, Truth("size_mismatch", ranks=(0, 1), op="recv"), RECV_DEADLOCK.split(" (")[0] + " (size mismatch)")
def send_recv_sizes_differ(rank, world_size):
    if rank == 0:
        dist.send(torch.ones(4), dst=1)
    else:
        dist.recv(torch.zeros(3), src=0)


@program(2, CORRECT, "the tutorials' isend/irecv exchange (isend and irecv before waiting)")
def isend_irecv_exchange(rank, world_size):
    out, got = torch.full((2,), float(rank)), torch.zeros(2)
    works = [dist.isend(out, dst=1 - rank), dist.irecv(got, src=1 - rank)]
    for work in works:
        work.wait()
    return got.tolist()


@program(2, Truth("p2p_unmatched", ranks=(0,), op="irecv", accept=("missing",)), "a hostile review of the doctor's "
         "records: rank 0 posts 40 irecvs (tags 0-39) and waits on each in order; rank 1 sends tags 1-39 only")
def forty_irecvs_one_unmatched(rank, world_size):
    bufs = [torch.zeros(4) for _ in range(40)]
    if rank == 0:
        for req in [dist.irecv(bufs[k], src=1, tag=k) for k in range(40)]:
            req.wait()
    else:
        [dist.isend(bufs[k], dst=0, tag=k) for k in range(1, 40)]
    dist.barrier()
