"""DistributedDataParallel: uneven data with and without join, an early exit, unused parameters, no_sync."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.join import Join

from tests.bug_corpus.common import LR, mlp, my_half, train
from tests.bug_corpus.truth import CORRECT, Truth, program

TORCH_DDP_TESTS = "torch/testing/_internal/distributed/distributed_test.py"
UNEVEN = "https://github.com/pytorch/pytorch/issues/33148 (DDP ranks with different numbers of batches hang)"


@program(2, CORRECT, "the DDP tutorial's demo_basic (notebook 05)", quick=True)
def ddp_correct(rank, world_size):
    train(nn.parallel.DistributedDataParallel(mlp()), rank, world_size, 3)


@program(2, Truth("missing", ranks=(1,)), UNEVEN + "; the doctor's review: rank 1 runs "
         "one step fewer and exits normally", quick=True)
def ddp_rank_one_step_fewer(rank, world_size):
    train(nn.parallel.DistributedDataParallel(mlp()), rank, world_size, 4 if rank == 0 else 3)


@program(2, CORRECT, "https://github.com/pytorch/pytorch/issues/38174 (uneven inputs, DDP's join context manager); "
         + TORCH_DDP_TESTS + "::test_ddp_uneven_inputs", timeout=30)
def ddp_uneven_with_join(rank, world_size):
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with Join([model]):
        for step in range(4 if rank == 0 else 2):
            x, y = my_half(step, rank, world_size)
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()


@program(3, Truth("missing", ranks=(2,), op="all_reduce"), UNEVEN + ": a 3-rank run where rank 2's loader is "
         "2 batches short, without join")
def ddp_uneven_without_join(rank, world_size):
    train(nn.parallel.DistributedDataParallel(mlp()), rank, world_size, 2 if rank == 2 else 4)


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x, use_b: bool):
        return self.a(x) + (self.b(x) if use_b else 0)


@program(2, Truth("missing", ranks=(1,), op="all_reduce"), TORCH_DDP_TESTS +
         "::test_ddp_control_flow_different_across_ranks; https://github.com/pytorch/pytorch/issues/43259 "
         "(a layer that one rank's forward skips, without find_unused_parameters)")
def ddp_rank_dependent_branch(rank, world_size):
    model = nn.parallel.DistributedDataParallel(_Branchy())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(3):
        x, y = my_half(step, rank, world_size)
        F.mse_loss(model(x, use_b=(rank == 0)), y).backward()
        opt.step()
        opt.zero_grad()


@program(2, CORRECT, "DDP's no_sync for gradient accumulation (the docs' example)")
def ddp_no_sync_accumulation(rank, world_size):
    model = nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(2):
        x, y = my_half(step, rank, world_size)
        with model.no_sync():
            (F.mse_loss(model(x[:2]), y[:2]) / 2).backward()
        (F.mse_loss(model(x[2:]), y[2:]) / 2).backward()
        opt.step()
        opt.zero_grad()


@program(2, Truth("missing", ranks=(0,)), "a learner's accumulation where only rank 0 uses no_sync: rank 1 "
         "all_reduces after every micro-batch (measured: rank 0 ends, rank 1 waits in DDP's bucket rebuild)")
def ddp_no_sync_on_one_rank(rank, world_size):
    model = nn.parallel.DistributedDataParallel(mlp())
    x, y = my_half(0, rank, world_size)
    if rank == 0:
        with model.no_sync():
            F.mse_loss(model(x[:2]), y[:2]).backward()
    else:
        F.mse_loss(model(x[:2]), y[:2]).backward()
    F.mse_loss(model(x[2:]), y[2:]).backward()
    if rank == 1:
        F.mse_loss(model(x), y).backward()


@program(2, Truth("size_mismatch", ranks=(1,), op="broadcast"), TORCH_DDP_TESTS +
         "::test_ddp_model_diff_shape_across_ranks (rank 1 builds a wider layer: the broadcast of the module's "
         "states from rank 0 moves buffers of different sizes; measured: rank 1 ends, rank 0 waits in it)")
def ddp_models_differ(rank, world_size):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16 if rank == 0 else 32), nn.Tanh())
    nn.parallel.DistributedDataParallel(model)
