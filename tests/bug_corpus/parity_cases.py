"""The parity tool's cases: a learner's data-parallel, FSDP2 and tensor-parallel training, recorded with
ppkit.ParityRecorder on every rank and compared with the same training in one process. Correct runs (fp32, bf16
autocast, FSDP2's mixed precision) and planted bugs (a sum for a mean, accumulation not divided, a skipped
optimizer step, gradients recorded after zero_grad, seeds, the data each rank takes, the learning rate)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ppkit
from tests.bug_corpus.common import LR, batch, mlp, my_half
from tests.bug_corpus.truth import CORRECT, Truth, program

STEPS = 3
PARITY_REVIEW = "the parity tool's review (a learner's own training code)"
OPTIONS = dict(tools=("parity",), entries=("cluster",), timeout=60)


def reference(what="grads", autocast=False, steps=STEPS, accumulate=1):
    """The one-process run a parallel one must equal."""
    def run():
        model = mlp()
        rec, opt = ppkit.ParityRecorder(what), torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(steps):
            x, y = batch(step)
            with _autocast(autocast):
                loss = F.mse_loss(model(x), y)
            loss.backward()
            rec.record(step, model, loss)
            opt.step()
            opt.zero_grad()
        return rec.run
    return run


def _autocast(on: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def _dp(rank, world_size, *, what="grads", average=True, seed=0, lr=LR, skip_step=None, data_rank=None,
        zero_before_record=False, mean_loss=True, autocast=False, ddp=False, micro=1, steps=STEPS):
    model = mlp(seed)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    rec, opt = ppkit.ParityRecorder(what), torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = my_half(step, rank if data_rank is None else data_rank, world_size)
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            with _autocast(autocast):
                loss = F.mse_loss(model(xm), ym)
            loss.backward()
        if not ddp:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                if average:
                    p.grad /= world_size
        if zero_before_record:
            opt.step()
            opt.zero_grad()
        rec.record(step, model, loss.float(), mean_over=dist.group.WORLD if mean_loss else None)
        if not zero_before_record and not (skip_step == step and rank == 1):
            opt.step()
        opt.zero_grad()
    return rec.run


@program(2, CORRECT, "tests/test_parity.py's data-parallel run (all_reduce, then divide)", reference=reference(),
         quick=True, **OPTIONS)
def parity_dp_correct(rank, world_size):
    return _dp(rank, world_size)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, causes=("sum_not_mean",)), "a learner's all_reduce "
         "without the division by the world size", reference=reference(), quick=True, **OPTIONS)
def parity_dp_sum_not_mean(rank, world_size):
    return _dp(rank, world_size, average=False)


@program(2, CORRECT, "the DDP tutorial, recorded", reference=reference(), **OPTIONS)
def parity_ddp_correct(rank, world_size):
    return _dp(rank, world_size, ddp=True)


@program(2, CORRECT, PARITY_REVIEW + ": a correct bf16-autocast DDP run", reference=reference(autocast=True),
         quick=True, **OPTIONS)
def parity_ddp_bf16_autocast_correct(rank, world_size):
    return _dp(rank, world_size, ddp=True, autocast=True)


@program(2, CORRECT, PARITY_REVIEW + ": a correct bf16-autocast DDP run of 10 steps (the tolerance over more steps)",
         reference=reference(autocast=True, steps=10), **OPTIONS)
def parity_ddp_bf16_autocast_10_steps_correct(rank, world_size):
    return _dp(rank, world_size, ddp=True, autocast=True, steps=10)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, causes=("accumulation", "scale_other")), PARITY_REVIEW +
         ": gradient accumulation over 2 micro-batches, the loss not divided by 2", reference=reference(),
         **OPTIONS)
def parity_accumulation_not_divided(rank, world_size):
    return _dp(rank, world_size, ddp=True, micro=2)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=2, causes=("skipped_step",)), PARITY_REVIEW + ": rank 1 "
         "skips optimizer.step() at step 1", reference=reference("params"), **OPTIONS)
def parity_skipped_optimizer_step(rank, world_size):
    return _dp(rank, world_size, what="params", skip_step=1)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, causes=("grads_none",)), PARITY_REVIEW +
         ": gradients recorded after zero_grad() (None by default)", reference=reference(), **OPTIONS)
def parity_recorded_after_zero_grad(rank, world_size):
    return _dp(rank, world_size, zero_before_record=True)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, causes=("drift", "init")), "a learner's data parallel "
         "without DDP's broadcast: each rank builds its model from its own seed", reference=reference(),
         **OPTIONS)
def parity_seed_per_rank(rank, world_size):
    return _dp(rank, world_size, seed=rank)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, causes=("data",)), "a sampler that gives every rank "
         "the same shard (DistributedSampler built without the rank)", reference=reference(), **OPTIONS)
def parity_same_data_every_rank(rank, world_size):
    return _dp(rank, world_size, data_rank=0)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=1, causes=("drift", "lr")), "a learning rate that one "
         "rank's config sets differently", reference=reference("params"), **OPTIONS)
def parity_lr_differs_on_rank1(rank, world_size):
    return _dp(rank, world_size, what="params", lr=LR if rank == 0 else 2 * LR)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, name="loss", causes=("loss_own",)), "the recorder's "
         "docs: each rank records its own batch's loss without mean_over", reference=reference(), **OPTIONS)
def parity_loss_without_mean(rank, world_size):
    return _dp(rank, world_size, mean_loss=False)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=0, causes=("dp_missing",)), "a learner's data parallel "
         "that never all_reduces the gradients", reference=reference(), **OPTIONS)
def parity_no_gradient_allreduce(rank, world_size):
    model = mlp()
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = my_half(step, rank, world_size)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        rec.record(step, model, loss, mean_over=dist.group.WORLD)
        opt.step()
        opt.zero_grad()
    return rec.run


def _fsdp2_run(rank, world_size, mp_policy=None):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    policy = {"mp_policy": mp_policy} if mp_policy is not None else {}
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = my_half(step, rank, world_size)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        rec.record(step, model, loss.float(), mean_over=dist.group.WORLD)
        opt.step()
        opt.zero_grad()
    return rec.run


@program(2, CORRECT, "torch's FSDP2 tutorial, recorded (DTensor shards)", reference=reference(), **OPTIONS)
def parity_fsdp2_correct(rank, world_size):
    return _fsdp2_run(rank, world_size)


@program(2, CORRECT, PARITY_REVIEW + ": FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), "
         "torchtitan's recipe", reference=reference(autocast=True), **OPTIONS)
def parity_fsdp2_mixed_precision_correct(rank, world_size):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return _fsdp2_run(rank, world_size, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))


def _tp_run(rank, world_size, scale_rank1=False):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    model = parallelize_module(mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if scale_rank1 and rank == 1:
            model[0].weight.grad.mul_(2)  # the planted bug: rank 1 doubles its piece
        rec.record(step, model, loss)
        opt.step()
        opt.zero_grad()
    return rec.run


@program(2, CORRECT, "torch's tensor-parallel example, recorded (DTensor shards)", reference=reference(),
         **OPTIONS)
def parity_tp_correct(rank, world_size):
    return _tp_run(rank, world_size)


@program(2, Truth("wrong_numbers", ranks=(1,), step=0, name="0.weight", causes=("one_rank",)), "a tensor-"
         "parallel run where one rank alone scales its piece of a gradient", reference=reference(), **OPTIONS)
def parity_tp_one_rank_scales(rank, world_size):
    return _tp_run(rank, world_size, scale_rank1=True)


class Attention(nn.Module):
    """A token mixer with nn.MultiheadAttention: its key bias's gradient is zero but for rounding (softmax does not
    change when the same number is added to every score), which Adam divides by its own size."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        h = self.inp(x)
        return self.out(self.attn(h, h, h, need_weights=False)[0]).mean(1)


def _adam_attention(rank=0, world_size=1, lr_rank1=1.0):
    """Adam (lr 1e-3) over Attention, DDP where there are ranks, parameters recorded."""
    model = Attention()
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    rec = ppkit.ParityRecorder("params")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (lr_rank1 if rank == 1 else 1.0))
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = (t.chunk(world_size)[rank] for t in (torch.randn(8, 6, 8, generator=g), torch.randn(8, 4, generator=g)))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        rec.record(step, model, loss, mean_over=dist.group.WORLD if world_size > 1 else None)
        opt.step()
        opt.zero_grad()
    return rec.run


@program(2, CORRECT, PARITY_REVIEW + ": a correct Adam fp32 DDP run of an attention layer (its key bias's update is "
         "float32's rounding divided by itself)", reference=_adam_attention, **OPTIONS)
def parity_adam_attention_correct(rank, world_size):
    return _adam_attention(rank, world_size)


@program(2, Truth("wrong_numbers", ranks=(0, 1), step=1, causes=("lr",)), PARITY_REVIEW + ": the same Adam run, "
         "rank 1's learning rate 2x", reference=_adam_attention, **OPTIONS)
def parity_adam_lr_differs_on_rank1(rank, world_size):
    return _adam_attention(rank, world_size, lr_rank1=2.0)
