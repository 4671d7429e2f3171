"""FSDP2, tensor parallel and pipelining (hand-written stages and torch.distributed.pipelining) as the doctor
sees them: correct runs, a rank that skips a step, a stage that waits for the wrong thing."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests.bug_corpus.common import batch, mlp, train
from tests.bug_corpus.truth import CORRECT, Truth, program

FSDP2 = "torch's FSDP2 tutorial (fully_shard per layer, then the model)"
TP = "torch's tensor-parallel example (ColwiseParallel, RowwiseParallel)"


def _fsdp2(world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp2_train(rank, world_size, steps):
    train(_fsdp2(world_size), rank, world_size, steps)


@program(2, CORRECT, FSDP2, quick=True, timeout=30)
def fsdp2_correct(rank, world_size):
    _fsdp2_train(rank, world_size, 2)


@program(2, Truth("missing", ranks=(1,), op="all_gather_into_tensor"), FSDP2 + ", rank 1 one step short",
         timeout=15)
def fsdp2_rank_one_step_short(rank, world_size):
    _fsdp2_train(rank, world_size, 3 if rank == 0 else 2)


def _tp(world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    return parallelize_module(mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


@program(2, CORRECT, TP, timeout=30)
def tp_correct(rank, world_size):
    model = _tp(world_size)
    x, y = batch(0)
    F.mse_loss(model(x), y).backward()


@program(2, Truth("missing", ranks=(1,), op="all_reduce"), TP + ", rank 1 skips the second forward (its "
         "data loader ended)", timeout=15)
def tp_rank_skips_forward(rank, world_size):
    model = _tp(world_size)
    for step in range(2 if rank == 0 else 1):
        x, _ = batch(step)
        model(x).sum().backward()


def _stage(rank):
    torch.manual_seed(rank)
    return torch.nn.Linear(8, 8)


@program(2, CORRECT, "notebook 06's two-stage pipeline by hand (send activations, send gradients back)",
         quick=True)
def pipeline_by_hand_correct(rank, world_size):
    stage = _stage(rank)
    for step in range(3):
        x, _ = batch(step)
        if rank == 0:
            out = stage(x)
            dist.send(out.detach(), dst=1)
            grad = torch.empty_like(out)
            dist.recv(grad, src=1)
            out.backward(grad)
        else:
            act = torch.empty(8, 8, requires_grad=False)
            dist.recv(act, src=0)
            act.requires_grad_()
            stage(act).sum().backward()
            dist.send(act.grad, dst=0)


@program(2, Truth("size_mismatch", ranks=(0, 1), op="recv"), "a hand-written pipeline whose second stage "
         "receives a buffer of the wrong shape")
def pipeline_by_hand_wrong_shape(rank, world_size):
    stage = _stage(rank)
    x, _ = batch(0)
    if rank == 0:
        dist.send(stage(x).detach(), dst=1)
    else:
        act = torch.empty(8, 4)  # the mistake: the first stage sends [8, 8]
        dist.recv(act, src=0)


@program(2, Truth("p2p_deadlock", ranks=(0, 1), op="recv"), "a hand-written pipeline where the first stage waits "
         "for the gradient before it sends the activation")
def pipeline_by_hand_grad_first(rank, world_size):
    stage = _stage(rank)
    x, _ = batch(0)
    if rank == 0:
        out = stage(x)
        grad = torch.empty_like(out)
        dist.recv(grad, src=1)
        dist.send(out.detach(), dst=1)
    else:
        act = torch.empty(8, 8)
        dist.recv(act, src=0)
        dist.send(act, dst=0)


@program(2, CORRECT, "torch.distributed.pipelining's ScheduleGPipe (the pipelining tutorial)", timeout=30)
def pipelining_gpipe_correct(rank, world_size):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(_stage(rank), rank, world_size, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, y: F.mse_loss(out, y))
    x, _ = batch(0)
    y = torch.zeros(8, 8)
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=[])
