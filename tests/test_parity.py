"""ppkit.compare_runs on real parallel runs: one planted bug each (data, tensor and pipeline parallel, DTensor
shards), and the tool must name the step, the tensor and the rank; the same runs without the bug are equal.

Every run is one job on the module's 2-rank cluster (cluster2), a few steps of a 5-layer MLP.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import ppkit
from ppkit.lessons import parity_tp
from ppkit.lessons.tensor_parallel import copy_to_parallel, reduce_from_parallel

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS, BATCH, LR = 3, 8, 0.1


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def data(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def one_process(model, batches, steps: int) -> ppkit.ParityRun:
    """The reference: ``model`` trained in this process for ``steps`` SGD steps on ``batches(step)``, recorded."""
    rec = ppkit.ParityRecorder()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batches(step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        rec.record(step, model, loss)
        opt.step()
        opt.zero_grad()
    return rec.run


def reference(steps: int = STEPS) -> ppkit.ParityRun:
    return one_process(make_model(), data, steps)


@pytest.fixture(scope="module")
def ref():
    return reference()


# -- data parallel -------------------------------------------------------------------------------------

def dp_train(rank, world_size, average=True, ddp=False, amp=False, bad_rank=None):
    """Each rank its half of the batch; gradients all_reduced (and averaged, unless the planted bug). amp: the
    forward under CPU autocast in bfloat16 (the learner's own mixed precision); bad_rank: that rank's targets are
    shifted a little (its data differs: under amp, a wrong loss within bf16's tolerance)."""
    model = make_model()
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = (t.chunk(world_size)[rank] for t in data(step))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss = F.mse_loss(out.float(), y + (0.08 if rank == bad_rank else 0.0))
        loss.backward()
        if not ddp:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                if average:
                    p.grad /= world_size
        rec.record(step, model, loss, mean_over=dist.group.WORLD)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_data_parallel_without_the_average_is_named_at_its_first_gradient(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(dp_train, False))
    first = report.first
    assert not report.equal
    assert (first.step, first.kind, first.name, first.rank) == (0, "grad", "4.bias", 0)
    assert first.rel_diff == pytest.approx(1.0, rel=1e-4)  # 2x: the difference is as large as the value
    text = str(report)
    assert "2x the reference on every rank" in text and "summed where it should average" in text
    assert [d for d in report.differences if d.kind == "loss" and d.step == 0] == []  # the forward was right
    with pytest.raises(ppkit.ParityError, match="step 0, gradient 4.bias, rank 0") as caught:
        report.raise_if_different()
    assert caught.value.report is report


def test_data_parallel_runs_that_average_equal_the_reference(cluster2, ref):
    for ddp in (False, True):  # DDP's "module." prefix is left out of the names
        report = ppkit.compare_runs(ref, cluster2.run(dp_train, True, ddp))
        assert report.equal, str(report)
        assert report.names == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
        assert report.raise_if_different() is report


def test_each_rank_recording_its_own_loss_is_explained(cluster2, ref):
    def own_loss(rank, world_size):
        model, rec = make_model(), ppkit.ParityRecorder()
        x, y = (t.chunk(world_size)[rank] for t in data(0))
        rec.record(0, None, F.mse_loss(model(x), y))
        return rec.run

    report = ppkit.compare_runs(ref, cluster2.run(own_loss))
    assert (report.first.step, report.first.kind) == (0, "loss")
    assert "the mean of the ranks' losses is the reference's" in str(report) and "mean_over" in str(report)


# -- tensor parallel -----------------------------------------------------------------------------------

def fixed_tp_mlp(x, fc1, fc2, log):
    x = copy_to_parallel(x, log, "fc1")
    return reduce_from_parallel(F.linear(F.gelu(fc1(x)), fc2.weight), log, "fc2") + fc2.bias


def test_the_missing_all_reduce_in_a_tensor_parallel_backward_is_named(cluster2):
    ref = parity_tp.reference()
    runs = [run for run, _ in cluster2.run(parity_tp.train)]  # the planted block
    report = ppkit.compare_runs(ref, runs)
    first = report.first
    assert (first.step, first.kind, first.name, first.rank) == (0, "grad", "inp.bias", 0)
    assert not any(d.step == 0 and (d.kind == "loss" or d.name.startswith(("mlp.", "head."))) for d in
                   report.differences)  # the forward and the block's own gradients are right at step 0
    assert "each of ranks [0, 1] holds only its own part of the gradient of inp.bias: their sum is the reference" \
        in str(report)
    assert "all_reduce is missing in backward" in str(report) and "copy_to_parallel" in str(report)
    fixed = ppkit.compare_runs(ref, [run for run, _ in cluster2.run(parity_tp.train, fixed_tp_mlp)])
    assert fixed.equal, str(fixed)


def rank1_backward_tp_mlp(x, fc1, fc2, log):
    """The fixed block, but rank 1 triples the gradient of its fc1 output in backward: a bug on one rank only."""
    h = fc1(copy_to_parallel(x, log, "fc1"))
    if dist.get_rank() == 1:
        h.register_hook(lambda grad: grad * 3)
    return reduce_from_parallel(F.linear(F.gelu(h), fc2.weight), log, "fc2") + fc2.bias


def test_a_bug_on_one_tensor_parallel_rank_names_that_rank(cluster2):
    report = ppkit.compare_runs(parity_tp.reference(1), [run for run, _ in cluster2.run(
        parity_tp.train, rank1_backward_tp_mlp, steps=1)])
    first = report.first
    assert (first.step, first.kind, first.name, first.rank) == (0, "grad", "mlp.fc1.bias", 1)
    assert "the gradient of mlp.fc1.bias is 3x the reference on rank 1" in str(report)
    assert not [d for d in report.differences if d.name.startswith("mlp.") and d.rank == 0]


def test_swapped_tensor_parallel_shards_name_whose_piece_a_rank_holds(cluster2):
    def swapped(rank, world_size):
        run, _ = parity_tp.train(rank, world_size, fixed_tp_mlp, steps=1)
        other = (rank + 1) % world_size
        for name in ("mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight"):  # the recorder told the wrong index
            piece = run.tensors[0][name]
            run.tensors[0][name] = ppkit.parity.Piece(piece.value, chunk=(piece.chunk[0], other, world_size))
        return run

    report = ppkit.compare_runs(parity_tp.reference(1), cluster2.run(swapped))
    assert (report.first.name, report.first.rank) == ("mlp.fc2.weight", 0)
    assert "rank 0 holds the piece of the gradient of mlp.fc2.weight that belongs to rank 1" in str(report)


# -- pipeline parallel ---------------------------------------------------------------------------------

def pp_train(rank, world_size, bug=None, microbatches=2, amp=False, precision=None):
    """Two stages by hand: rank 0 holds layers 0-1, rank 1 layers 2-4 (numbered from 0 in its own Sequential).
    bug "reorder": stage 0 sends the micro-batches last first; "drop": stage 0 ignores the gradient sent back.
    amp: each stage's forward under CPU autocast in bfloat16; precision: given to the recorder."""
    full = make_model()
    stage = nn.Sequential(*full[:2]) if rank == 0 else nn.Sequential(*full[2:])
    rename = None if rank == 0 else (lambda n: f"{int(n.split('.')[0]) + 2}.{n.split('.', 1)[1]}")
    rec = ppkit.ParityRecorder(rename=rename, precision=precision)
    opt = torch.optim.SGD(stage.parameters(), lr=LR)
    for step in range(STEPS):
        xs, ys = (t.chunk(microbatches) for t in data(step))
        order = list(range(microbatches))[::-1] if bug == "reorder" else list(range(microbatches))
        total = torch.zeros(())
        for m in order if rank == 0 else range(microbatches):
            if rank == 0:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    out = stage(xs[m]).float()
                dist.send(out.detach(), 1)
                grad = torch.empty_like(out)
                dist.recv(grad, 1)
                if bug != "drop":
                    out.backward(grad)
            else:
                inp = torch.empty(xs[m].shape[0], 16)
                dist.recv(inp, 0)
                inp.requires_grad_()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    out = stage(inp).float()
                loss = F.mse_loss(out, ys[m]) / microbatches
                loss.backward()
                dist.send(inp.grad, 0)
                total += loss.detach()
        rec.record(step, stage, total if rank == 1 else None)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_a_clean_two_stage_pipeline_equals_the_reference(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(pp_train))
    assert report.equal, str(report)


def test_a_bf16_pipeline_the_recorder_cannot_see_says_so_and_precision_settles_it(cluster2, ref):
    """Each stage's autocast ends before record, and the loss is a detached sum: nothing shows bfloat16."""
    unseen = str(ppkit.compare_runs(ref, cluster2.run(pp_train, amp=True)))
    assert "if the run computed in bfloat16 where the recorder could not see it" in unseen, unseen
    assert "precision=torch.bfloat16" in unseen
    said = ppkit.compare_runs(ref, cluster2.run(pp_train, amp=True, precision=torch.bfloat16))
    assert said.equal and "bfloat16: precision= given to ParityRecorder" in str(said), str(said)


def test_reordered_micro_batches_are_named_on_the_last_stage(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(pp_train, "reorder"))
    assert (report.first.step, report.first.kind, report.first.rank) == (0, "loss", 1)
    grads = [d for d in report.differences if d.kind == "grad"]  # 4.bias's gradient, a sum over every sample of
    assert (grads[0].step, grads[0].name, grads[0].rank) == (0, "4.weight", 1)  # output - target, ignores the order
    assert "micro-batch" in str(report)


def test_a_stage_that_drops_the_gradient_sent_back_is_named(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(pp_train, "drop"))
    first = report.first
    assert (first.step, first.kind, first.name, first.rank, first.note) == (0, "grad", "0.bias", 0, "no gradient")
    assert "every gradient rank 0 recorded at step 0 is None (0.bias among them), and it recorded no loss" in \
        str(report) and "torch.autograd.backward(output, received_gradient)" in str(report)


# -- DTensor shards: FSDP2 -----------------------------------------------------------------------------

def fsdp_train(rank, world_size, bug=None, mixed=False):
    """FSDP2 over both ranks; bug "sum": gradients summed, not averaged; "zero": rank 1 zeroes its shard of
    2.weight's gradient after backward (a zero_grad in the wrong place, on one rank); "scale": rank 1's half of
    every gradient 5x. mixed: torchtitan's recipe, parameters gathered and computed in bfloat16, gradients
    reduced in float32, and the loss recorded as a number (no graph for the recorder to read)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else \
        MixedPrecisionPolicy()
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if bug == "sum":  # each Linear is its own FSDP unit, with its own reduce-scatter
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.set_gradient_divide_factor(1.0)
                layer.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = (t.chunk(world_size)[rank] for t in data(step))
        loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        if bug == "zero" and rank == 1:
            model[2].weight.grad.to_local().zero_()
        if bug == "scale" and rank == 1:
            for p in model.parameters():
                p.grad.to_local().mul_(5)
        rec.record(step, model, loss.item() if mixed else loss, mean_over=dist.group.WORLD)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_fsdp2_shards_are_compared_where_they_lie(cluster2, ref):
    clean = cluster2.run(fsdp_train)
    assert clean[0].tensors[0]["2.weight"].offset == (0, 0) and clean[1].tensors[0]["2.weight"].offset == (8, 0)
    assert ppkit.compare_runs(ref, clean).equal
    summed = ppkit.compare_runs(ref, cluster2.run(fsdp_train, "sum"))
    assert (summed.first.step, summed.first.name, summed.first.rank) == (0, "4.bias", 0)
    assert "2x the reference" in str(summed)


def test_a_run_only_rank_0_returned_is_refused_not_passed(cluster2, ref):
    def rank0_only(rank, world_size):  # rank 1's half of every gradient is 5x, and only rank 0 returns its run
        run = fsdp_train(rank, world_size, "scale")
        return run if rank == 0 else None

    runs = cluster2.run(rank0_only)
    with pytest.raises(ppkit.ConfigError, match=r"rank 0 recorded pieces of 4.bias at step 0 that cover 2 of its 4 "
                                                r"elements.*Rank 1 handed back nothing: return recorder.run from "
                                                "every rank"):
        ppkit.compare_runs(ref, runs)


def test_one_rank_s_wrong_shard_names_that_rank(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(fsdp_train, "zero"))
    first = report.first
    assert (first.step, first.name, first.rank) == (0, "2.weight", 1)
    assert not [d for d in report.differences if d.step == 0 and d.rank == 0]
    assert "all zeros on rank 1" in str(report)


# -- DTensor tensor parallel with sequence parallel ---------------------------------------------------

def sp_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


def sp_data(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 4, 16, generator=g), torch.randn(2, 4, 16, generator=g)


def sp_reference(steps: int = 2) -> ppkit.ParityRun:
    return one_process(sp_model(), sp_data, steps)


def sp_train(rank, world_size, sharded_loss=False, steps=2, bad_rank=None):
    """LayerNorm under SequenceParallel (each rank its half of the tokens), fc1 column-, fc2 row-parallel.
    sharded_loss: fc2's output stays sharded by tokens and each rank takes the mean of its own tokens' loss,
    so backward adds world_size means: the gradients are world_size x the reference. bad_rank: that rank's
    piece of fc1's weight gradient is 3x at step 0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world_size,))
    out = Shard(1) if sharded_loss else Replicate()
    model = parallelize_module(sp_model(), mesh, {"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1)),
                                                  "3": RowwiseParallel(output_layouts=out)})
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = sp_data(step)
        target = y.chunk(world_size, dim=1)[rank] if sharded_loss else y
        loss = F.mse_loss(model(x.chunk(world_size, dim=1)[rank]), target)
        loss.backward()
        if step == 0 and rank == bad_rank:
            model[1].weight.grad.to_local().mul_(3)
        rec.record(step, model, loss, mean_over=dist.group.WORLD if sharded_loss else None)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_dtensor_tensor_and_sequence_parallel_pieces_are_found_and_compared(cluster2):
    runs = cluster2.run(sp_train)
    pieces = runs[1].tensors[0]
    assert (pieces["1.weight"].offset, pieces["3.weight"].offset, pieces["0.weight"].offset) == ((16, 0), (0, 16), (0,))
    report = ppkit.compare_runs(sp_reference(), runs)  # LayerNorm's Partial gradients summed by the recorder
    assert report.equal, str(report)


def test_one_tensor_parallel_rank_s_wrong_piece_names_that_rank(cluster2):
    report = ppkit.compare_runs(sp_reference(1), cluster2.run(sp_train, steps=1, bad_rank=1))
    assert [(d.step, d.name, d.rank) for d in report.differences] == [(0, "1.weight", 1)]
    assert "the gradient of 1.weight is 3x the reference on rank 1" in str(report)


def test_a_loss_averaged_over_each_rank_s_own_tokens_is_named(cluster2):
    report = ppkit.compare_runs(sp_reference(), cluster2.run(sp_train, True))
    first = report.first
    assert (first.step, first.kind, first.name, first.rank) == (0, "grad", "3.bias", 0)
    assert "the gradient of 3.bias is 2x the reference on every rank" in str(report)
    assert not [d for d in report.differences if d.kind == "loss" and d.step == 0]


# -- FSDP2 x tensor parallel on a 2 x 2 mesh ------------------------------------------------------------

def fsdp_tp_train(rank, world_size, steps=2, bad=None, by_hand=None):
    """dp 2 x tp 2: fc1 column-, fc2 row-parallel over tp, then FSDP2 over dp: fc1's parameters get a strided
    shard (rank (dp, tp) holds rows 8 * (2 * tp + dp) onward: still a box), fc2's weight (Shard(0), Shard(1)):
    a 2-D box. bad: {rank: parameter} whose piece of the gradient is 3x at step 0 on that rank. by_hand: no
    FSDP2; the data-parallel all_reduce by hand on each local gradient, over "dp" (right) or "world" (the bug:
    the group holds both tp pieces too) or "tp" (the bug: the tp group where the dp one belongs), divided by that
    group's size ("world/dp": divided by the dp size)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(sp_model(), mesh["tp"], {"1": ColwiseParallel(), "3": RowwiseParallel()})
    if by_hand is None:
        fully_shard(model, mesh=mesh["dp"])
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    dp = mesh["dp"].get_local_rank()
    for step in range(steps):
        x, y = sp_data(step)
        loss = F.mse_loss(model(x.chunk(2)[dp]), y.chunk(2)[dp])
        loss.backward()
        group = {"dp": mesh["dp"].get_group(), "world": dist.group.WORLD, "world/dp": dist.group.WORLD,
                 "tp": mesh["tp"].get_group()}.get(by_hand)
        for p in model.parameters() if group else ():
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(local, group=group)
            local /= 2 if by_hand == "world/dp" else dist.get_world_size(group)
        if step == 0 and rank in (bad or {}):
            model.get_parameter(bad[rank]).grad.to_local().mul_(3)
        rec.record(step, model, loss, mean_over=mesh["dp"])  # a 1-D mesh: its group
        opt.step()
        opt.zero_grad()
    return rec.run


def interleaved_reference() -> ppkit.ParityRun:
    rec = ppkit.ParityRecorder("params")
    rec.record(0, {"w": torch.arange(8.0).reshape(8, 1)})
    return rec.run


def interleaved_rows(rank, world_size):
    """Rows 0-7 on a 2 x 2 mesh as (Shard(0), _StridedShard(0, split_factor=2)): rank (i, j) holds rows 4i + j
    and 4i + j + 2, not consecutive. Also what recording a DTensor whose local tensor is not the size its
    placements say raises."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    mesh = init_device_mesh("cpu", (2, 2))
    first = 4 * (rank // 2) + rank % 2
    local = torch.tensor([[float(first)], [float(first + 2)]])
    w = DTensor.from_local(local, mesh, [Shard(0), _StridedShard(0, split_factor=2)], run_check=False,
                           shape=torch.Size([8, 1]), stride=(1, 1))
    rec = ppkit.ParityRecorder("params")
    rec.record(0, {"w": w})
    odd = DTensor.from_local(torch.zeros(3, 1), mesh, [Shard(0), Shard(0)], run_check=False,
                             shape=torch.Size([8, 1]), stride=(1, 1))  # 2 rows each, says torch: not 3
    try:
        ppkit.ParityRecorder("params").record(0, {"odd": odd})
    except ppkit.ConfigError as e:
        return rec.run, str(e)
    return rec.run, ""


@pytest.mark.slow  # 4 ranks: 20 s of the call on the shared 2-core machine (load 18), most of it imports
def test_fsdp2_over_tensor_parallel_pieces_are_each_rank_s_own(cluster4):
    runs = cluster4.run(fsdp_tp_train)
    strided = [(runs[r].tensors[0]["1.weight"].offset, tuple(runs[r].tensors[0]["1.weight"].value.shape))
               for r in range(4)]
    assert strided == [((0, 0), (8, 16)), ((16, 0), (8, 16)), ((8, 0), (8, 16)), ((24, 0), (8, 16))]
    assert not any(run.tensors[0]["1.weight"].gathered for run in runs)
    pieces = runs[3].tensors[0]
    assert (pieces["3.weight"].offset, tuple(pieces["3.weight"].value.shape)) == ((8, 16), (8, 16))
    report = ppkit.compare_runs(sp_reference(), runs)
    assert report.equal and report.ranks == [0, 1, 2, 3], str(report)
    interleaved, refused = zip(*cluster4.run(interleaved_rows))  # rows no box holds: gathered whole, compared
    assert "holds a local tensor of shape [3, 1] on rank 0, where torch expects [2, 1]" in refused[0]
    assert all(run.tensors[0]["w"].gathered for run in interleaved)
    assert ppkit.compare_runs(interleaved_reference(), interleaved).equal
    bad = ppkit.compare_runs(sp_reference(1), cluster4.run(fsdp_tp_train, 1, {3: "1.bias", 1: "1.weight"}))
    assert [(d.step, d.name, d.rank) for d in bad.differences] == [(0, "1.bias", 3), (0, "1.weight", 1)]
    assert "the gradient of 1.bias is 3x the reference on rank 3 only" in str(bad)
    assert "ranks 0, 1, 2' pieces equal the reference, so no collective is at fault" in str(bad)


# -- mixed precision: the tolerance follows what the run computed in ---------------------------------------

def test_a_correct_bf16_autocast_run_equals_the_fp32_reference(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(dp_train, ddp=True, amp=True))
    assert report.equal, str(report)
    assert "bfloat16" in str(report) and "autocast" in str(report)  # which tolerance, and why


def test_a_correct_fsdp2_mixed_precision_run_equals_the_fp32_reference(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(fsdp_train, mixed=True))
    assert report.equal, str(report)
    assert "MixedPrecisionPolicy" in str(report) and "bfloat16" in str(report)


def test_a_loss_within_bf16_tolerance_is_not_taken_as_proof_of_the_forward(cluster2, ref):
    report = ppkit.compare_runs(ref, cluster2.run(dp_train, ddp=True, amp=True, bad_rank=1))
    assert not report.equal
    assert not [d for d in report.differences if d.kind == "loss" and d.step == 0]  # the loss passed...
    text = str(report)
    assert "the forward matches" not in text and "backward differs" not in text, text
    assert "passed, but only within the bfloat16 tolerance" in text
    assert "does not show that the forward is right" in text


# -- the wrong group, accumulation, a skipped step, gradients after zero_grad ---------------------------------

def accumulate_train(rank, world_size, micro=3, divide=False, mean_over=True):
    """FSDP2 over the ranks, each rank's batch in ``micro`` micro-batches whose gradients accumulate; the loss
    not divided by ``micro`` (the bug) unless ``divide``; mean_over: the loss recorded with mean_over=WORLD (else
    the step's loss, all_reduced by hand: the record then does not say how many ranks are data-parallel)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = make_model()
    fully_shard(model, mesh=mesh)
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(1):
        x, y = (t.chunk(world_size)[rank] for t in data(step))
        total = 0.0
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            loss = F.mse_loss(model(xm), ym) / (micro if divide else 1)
            loss.backward()
            total += loss.item() / (1 if divide else micro)
        if not mean_over:
            total = torch.tensor(total)
            dist.all_reduce(total)
            total = total / world_size
        rec.record(step, model, total, mean_over=dist.group.WORLD if mean_over else None)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_gradient_accumulation_without_its_division_is_not_called_a_dp_sum(cluster2):
    ref = one_process(make_model(), lambda s: tuple(t[:8] for t in data(s)), 1)
    runs = cluster2.run(accumulate_train, 2)  # 2 micro-batches of 2 on each of 2 ranks: factor 2 = dp size
    both = str(ppkit.compare_runs(ref, runs))
    assert "2x the reference on every rank" in both
    assert "accumulat" in both and "data-parallel" in both, both  # both explanations fit a 2-rank mesh
    report = ppkit.compare_runs(ref, cluster2.run(accumulate_train, 4))  # factor 4 on a 2-rank mesh
    text = str(report)
    assert "4x the reference on every rank" in text
    assert "sum of 4 ranks" not in text, text  # there are 2
    assert "accumulat" in text and "averaged over 2 ranks" in text, text
    assert "a data-parallel sum alone does not fit" in text
    unsaid = str(ppkit.compare_runs(ref, cluster2.run(accumulate_train, 4, mean_over=False)))
    assert "4 data-parallel ranks cannot be made of this run's 2" in unsaid, unsaid
    assert "if this run has 4 data-parallel ranks" not in unsaid


def skip_step_train(rank, world_size, skip=(1, 1), after=False):
    """DDP, parameters recorded; rank skip[0] leaves out optimizer.step() at step skip[1]. after: every rank
    records after optimizer.step(), where the reference records before it."""
    model = nn.parallel.DistributedDataParallel(make_model())
    rec, opt = ppkit.ParityRecorder("params"), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = (t.chunk(world_size)[rank] for t in data(step))
        F.mse_loss(model(x), y).backward()
        if not after:
            rec.record(step, model)
        if (rank, step) != skip:
            opt.step()
        if after:
            rec.record(step, model)
        opt.zero_grad()
    return rec.run


def test_a_skipped_optimizer_step_is_recognised(cluster2):
    ref = ppkit.ParityRecorder("params")
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        F.mse_loss(model(data(step)[0]), data(step)[1]).backward()
        ref.record(step, model)
        opt.step()
        opt.zero_grad()
    report = ppkit.compare_runs(ref, cluster2.run(skip_step_train))
    first = report.first
    assert (first.step, first.kind, first.rank) == (2, "param", 1)
    text = str(report)
    assert "equals the reference's value at step 1" in text and "optimizer" in text, text
    assert "start from the same weights" not in text
    later = ppkit.compare_runs(ref, cluster2.run(skip_step_train, None, True))
    assert (later.first.step, later.first.rank) == (0, 0)
    assert "at step 0 equals the reference's value at step 1" in str(later)
    assert "after optimizer.step() here, before it there" in str(later)


def test_gradients_recorded_after_zero_grad_are_named(cluster2, ref):
    def after_zero_grad(rank, world_size):
        model = nn.parallel.DistributedDataParallel(make_model())
        rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
        x, y = (t.chunk(world_size)[rank] for t in data(0))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.record(0, model, loss, mean_over=dist.group.WORLD)  # too late: zero_grad set every .grad to None
        return rec.run

    text = str(ppkit.compare_runs(ref, cluster2.run(after_zero_grad)))
    assert "every gradient" in text and "None" in text and "zero_grad" in text, text
    assert "pipeline stage" not in text and "detached" not in text


def test_two_ranks_declaring_the_same_piece_are_named(cluster2, ref):
    def same_piece(rank, world_size):
        model = make_model()
        rec = ppkit.ParityRecorder(shards={"0.weight": (0, 0, world_size)})  # index 0 on every rank: the bug
        loss = F.mse_loss(model(data(0)[0]), data(0)[1])
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters()}
        grads["0.weight"] = grads["0.weight"].chunk(world_size)[0]
        rec.record(0, grads, loss)
        return rec.run

    with pytest.raises(ppkit.ConfigError) as caught:
        ppkit.compare_runs(ref, cluster2.run(same_piece))
    text = str(caught.value)
    assert "Ranks 0 and 1 declared the same piece of 0.weight" in text, text
    assert "Return recorder.run from every rank" not in text


@pytest.mark.slow  # 4 ranks
def test_an_all_reduce_over_the_wrong_group_is_named(cluster4):
    assert ppkit.compare_runs(sp_reference(1), cluster4.run(fsdp_tp_train, 1, by_hand="dp")).equal
    report = ppkit.compare_runs(sp_reference(1), cluster4.run(fsdp_tp_train, 1, by_hand="world"))
    text = str(report)
    assert report.first.name == "3.weight", text
    assert "averaged with" in text and "wrong group" in text, text
    assert "the data a rank" not in text
    divided = str(ppkit.compare_runs(sp_reference(1), cluster4.run(fsdp_tp_train, 1, by_hand="world/dp")))
    assert "the gradient of 3.bias is 2x the reference on every rank" in divided  # replicated over tp: counted twice
    assert "an all_reduce over all 4 ranks where the 2 data-parallel ranks' group belongs" in divided, divided
    tp = str(ppkit.compare_runs(sp_reference(1), cluster4.run(fsdp_tp_train, 1, by_hand="tp")))
    assert "wrong group" in tp and "mesh['tp'] where mesh['dp'] belongs" in tp, tp  # not only "missing"
