"""Programs a reviewer wrote against compare_runs that its authors had not chosen, kept as tests: what a learner
does (mixed precision on part of a model, a loss recorded as the docs say, an optimizer set up otherwise on one
rank, autocast left open in a kernel), each with what is true and what the tool must, or must not, say.

Every parallel run is one job on the module's 2-rank cluster (cluster2); the helpers are test_parity's.
"""

from __future__ import annotations

import sys

import cloudpickle
import torch
import torch.distributed as dist
import torch.nn.functional as F
from test_parity import LR, STEPS, data, make_model
from torch import nn

import ppkit
from tests.bug_corpus.parity_cases import Attention  # the corpus's model: its key bias's gradient is rounding

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def one_process(what="grads", weight=1.0, amp_at_record=False, factor=1.0, steps=STEPS) -> ppkit.ParityRun:
    """The reference in this process: the loss x ``weight`` (gradients of the size ``weight`` sets); ``factor``:
    a planted bug, the backward's loss x factor; ``amp_at_record``: an autocast block left open around the record
    call (a kernel's earlier cell), while the model ran in float32."""
    model, rec = make_model(), ppkit.ParityRecorder(what)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = data(step)
        loss = weight * F.mse_loss(model(x), y)
        (loss * factor).backward()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp_at_record):
            rec.record(step, model, loss)
        opt.step()
        opt.zero_grad()
    return rec.run


def dp_run(rank, world_size, what="grads", amp=False, average=True, weight=1.0, lr_rank1=1.0, skip=None, late=None,
           seed_per_rank=False, data_rank=None):
    """Data parallel by hand (all_reduce, then / world_size unless not ``average``), the loss recorded with
    mean_over as the docs say; ``amp``: the forward under CPU autocast in bfloat16; ``lr_rank1``: rank 1's
    optimizer built with that multiple of the learning rate; ``skip``: (rank, step) that leaves out
    optimizer.step(); ``late``: (step, factor), the loss x factor before backward from that step on (the last);
    ``seed_per_rank``: each rank builds its model from its own seed (no broadcast); ``data_rank``: every rank takes
    that rank's part of each batch (a sampler built without the rank)."""
    model, rec = make_model(rank if seed_per_rank else 0), ppkit.ParityRecorder(what)
    opt = torch.optim.SGD(model.parameters(), lr=LR * (lr_rank1 if rank == 1 else 1.0))
    for step in range(late[0] + 1 if late else STEPS):
        x, y = (t.chunk(world_size)[rank if data_rank is None else data_rank] for t in data(step))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss = weight * F.mse_loss(out.float(), y)
        (loss * (late[1] if late and step == late[0] else 1.0)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            if average:
                p.grad /= world_size
        rec.record(step, model, loss, mean_over=dist.group.WORLD)
        if (rank, step) != skip:
            opt.step()
        opt.zero_grad()
    return rec.run


def fsdp_first_layer_bf16(rank, world_size, bad_rank=None):
    """FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on the first Linear only, the loss
    recorded as loss.item(); bad_rank: that rank's targets shifted by 0.08 (its data differs)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    model = make_model()
    fully_shard(model[0], mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                      reduce_dtype=torch.float32,
                                                                      output_dtype=torch.float32))
    for layer in model[1:]:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    rec, opt = ppkit.ParityRecorder(), torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = (t.chunk(world_size)[rank] for t in data(step))
        loss = F.mse_loss(model(x).float(), y + (0.08 if rank == bad_rank else 0.0))
        loss.backward()
        rec.record(step, model, loss.item(), mean_over=dist.group.WORLD)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_a_2x_bug_on_small_bf16_gradients_is_flagged(cluster2):
    """Gradients of about 2e-3 under bf16 autocast, summed where they should be averaged: eps(bf16) must not be
    added to every comparison as an absolute allowance."""
    report = ppkit.compare_runs(one_process(weight=0.01), cluster2.run(dp_run, amp=True, average=False, weight=0.01))
    assert not report.equal, str(report)
    assert "2x the reference on every rank" in str(report), str(report)
    assert "atol 1.2e-07" in str(report)  # float32's rounding floor, not bf16's 7.8e-3


def test_a_2x_bug_under_bf16_is_named_a_factor(cluster2):
    text = str(ppkit.compare_runs(one_process(), cluster2.run(dp_run, amp=True, average=False)))
    assert "2x the reference on every rank" in text, text
    assert "not a scale" not in text


def noisy(what: str, steps=None, alike=False) -> list[ppkit.ParityRun]:
    """Two ranks' runs of the reference whose tensors (at ``steps``, all by default) differ from it by a
    little noise past the tolerance, as Adam's division by sqrt(v) makes of float32's rounding; ``alike``: the
    same noise on both ranks (DDP keeps them equal)."""
    runs = []
    for rank in range(2):
        run = one_process(what)
        run.rank, run.world_size = rank, 2
        g = torch.Generator().manual_seed(0 if alike else rank)
        for step, pieces in run.tensors.items():
            for piece in pieces.values() if steps is None or step in steps else ():
                piece.value.add_(1e-4 * piece.value.abs().max() * torch.randn(piece.value.shape, generator=g))
        runs.append(run)
    return runs


def test_a_small_difference_on_every_rank_is_not_called_one_rank_s_factor():
    """No factor of 1x, and no rank said to equal the reference that the list shows differing."""
    text = str(ppkit.compare_runs(one_process(), noisy("grads")))
    assert "1x the reference" not in text and "piece equals the reference" not in text, text


def test_parameters_that_differ_under_a_matching_loss_are_not_blamed_on_the_backward():
    """The loss equals the reference's; the parameters (as Adam leaves them on a correct run) do not: the
    update differs, which the optimizer or Adam's rounding makes as well as a backward."""
    text = str(ppkit.compare_runs(one_process("params"), noisy("params", steps=(1, 2), alike=True)))
    assert "backward differs" not in text, text
    assert "Adam" in text and "what='grads'" in text


def test_fsdp2_policy_on_the_first_layer_only_is_judged_in_its_precision(cluster2):
    """Every later layer's activations carry the first layer's bf16 rounding, and so every gradient does."""
    ref = one_process()
    report = ppkit.compare_runs(ref, cluster2.run(fsdp_first_layer_bf16))
    assert report.equal, str(report)
    assert "MixedPrecisionPolicy" in str(report)
    wrong = str(ppkit.compare_runs(ref, cluster2.run(fsdp_first_layer_bf16, bad_rank=1)))
    assert "only within the bfloat16 tolerance" in wrong and "float32 tolerance" not in wrong, wrong
    assert "x the reference" not in wrong  # rank 1's data differs: no scale is claimed that bf16 could make


def test_a_skipped_optimizer_step_is_named_with_the_loss_recorded(cluster2):
    text = str(ppkit.compare_runs(one_process("params"), cluster2.run(dp_run, "params", skip=(1, 0))))
    assert "rank 1's parameter" in text and "equals the reference's value at step 0" in text, text
    assert "skipped optimizer.step()" in text


def test_a_learning_rate_twice_the_reference_s_on_one_rank_is_named(cluster2):
    text = str(ppkit.compare_runs(one_process("params"), cluster2.run(dp_run, "params", lr_rank1=2.0)))
    assert "learning rate" in text and "rank 1" in text, text
    assert "2x the reference's update" in text, text
    assert "bfloat16" not in text  # the loss's graph showed float32: no unseen bf16 to offer


def test_autocast_left_open_at_record_does_not_judge_a_float32_run_in_bf16():
    """The model ran in float32 (the loss's graph says so): a 5 % bug must be flagged."""
    report = ppkit.compare_runs(one_process(amp_at_record=True), [one_process(factor=1.05)])
    assert not report.equal, str(report)
    assert report.first.kind == "grad"
    assert "1.05x the reference" in str(report) and "learning rate" not in str(report)  # no lr scales a gradient


def test_notebook_14_s_llama_with_a_planted_2x_under_bf16_is_flagged():
    from ppkit.lessons import capstone as cap
    from ppkit.models import llama

    def run(factor: float) -> ppkit.ParityRun:
        net, rec = llama.Llama(cap.RUN.config, cap.RUN.seed), ppkit.ParityRecorder()
        x, y = cap.batch_at(cap.RUN, 0)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=factor != 1.0):
            loss = cap.loss_fn(net(x).float(), y)
        (loss * factor).backward()
        rec.record(0, net, loss)
        return rec.run

    report = ppkit.compare_runs(run(1.0), [run(2.0)])
    assert not report.equal, str(report)
    assert report.tolerance.dtype == "torch.bfloat16"
    flagged = {d.name for d in report.differences}
    assert len(flagged) == len(report.names), f"{len(flagged)} of {len(report.names)} gradients flagged"
    assert "2x the reference" in str(report), str(report)


def test_an_equal_under_bf16_says_what_it_could_not_see(cluster2):
    report = ppkit.compare_runs(one_process(), cluster2.run(dp_run, amp=True))
    assert report.equal
    assert "it cannot see a difference up to 0.063 of a tensor's largest value at step 0" in str(report), str(report)
    assert "cannot see" not in str(ppkit.compare_runs(one_process(), cluster2.run(dp_run)))  # float32: nothing hidden


def test_a_loss_that_parts_after_a_matching_step_names_the_optimizer(cluster2):
    """Gradients recorded (not parameters); rank 1's learning rate is 2x: everything matched at step 0, so the
    step between is named beside the data."""
    text = str(ppkit.compare_runs(one_process(), cluster2.run(dp_run, lr_rank1=2.0)))
    assert "everything this rank recorded at step 0 matched" in text and "learning rate" in text, text


def test_a_late_1_5x_bug_under_bf16_is_not_called_2x(cluster2):
    """At step 5 bf16's tolerance is 0.38 of a tensor's largest value: 1.5 is not 2 within it."""
    text = str(ppkit.compare_runs(one_process(steps=6), cluster2.run(dp_run, amp=True, late=(5, 1.5))))
    assert "2x the reference" not in text, text


# -- causes, by identifier: what the record decides, and the candidates where it cannot -------------------------

def test_a_diagnosis_names_its_causes_by_identifier(cluster2):
    """Each finding carries stable identifiers of its causes (ppkit.parity.causes.CAUSES) beside its words."""
    from ppkit.parity.causes import CAUSES

    summed = ppkit.compare_runs(one_process(), cluster2.run(dp_run, average=False)).diagnosis
    assert "sum_not_mean" in summed.causes and set(summed.causes) <= set(CAUSES), summed
    assert "summed where it should average" in summed.why  # the words stay the learner's


def test_a_skipped_step_after_updated_steps_rules_out_another_record_point(cluster2):
    """Rank 1 skips optimizer.step() at step 1: its parameters matched at step 1, after an update the optimizer
    made, so neither another record point nor a parameter outside the optimizer fits. A step that ran without
    moving them (lr 0, zeroed gradients) leaves the same numbers: those stay listed, and it is not decided."""
    diagnosis = ppkit.compare_runs(one_process("params"), cluster2.run(dp_run, "params", skip=(1, 1))).diagnosis
    assert diagnosis.causes == ("skipped_step", "lr", "step_grad", "zeroed"), diagnosis
    first = ppkit.compare_runs(one_process("params"), cluster2.run(dp_run, "params", skip=(1, 0))).diagnosis
    assert first.causes[0] == "skipped_step" and "not_in_optimizer" in first.causes, first  # no update seen before


def test_a_learning_rate_on_one_rank_lists_what_its_parameters_cannot_tell_apart(cluster2):
    """Parameters alone cannot tell a learning rate 2x from a gradient 2x at the step (SGD): both, and unsure."""
    diagnosis = ppkit.compare_runs(one_process("params"), cluster2.run(dp_run, "params", lr_rank1=2.0)).diagnosis
    assert set(diagnosis.causes) == {"lr", "step_grad"} and diagnosis.unsure, diagnosis


def test_gradients_recorded_after_zero_grad_name_the_cause(cluster2):
    def after_zero_grad(rank, world_size):
        model, rec = make_model(), ppkit.ParityRecorder()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = (t.chunk(world_size)[rank] for t in data(0))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.record(0, model, loss, mean_over=dist.group.WORLD)
        return rec.run

    diagnosis = ppkit.compare_runs(one_process(steps=1), cluster2.run(after_zero_grad)).diagnosis
    assert diagnosis.causes[0] == "grads_none", diagnosis


def test_a_seed_per_rank_is_named_from_the_start_weights_with_gradients_recorded(cluster2):
    """Gradients recorded, each rank's model from its own seed: the recorder keeps the weights of the first
    step, and rank 1's differ from the reference's while rank 0's equal them."""
    report = ppkit.compare_runs(one_process(), cluster2.run(dp_run, seed_per_rank=True))
    assert report.diagnosis.causes == ("init",), str(report)
    assert "rank 1" in report.diagnosis.what and "step 0" in report.diagnosis.what, str(report)
    assert "rank 0" not in report.diagnosis.what, str(report)


def test_the_same_batch_on_every_rank_is_named(cluster2):
    """Every rank takes rank 0's part: the start weights equal the reference's and every rank's own loss is the
    same number, so they computed it on the same batch."""
    report = ppkit.compare_runs(one_process(), cluster2.run(dp_run, data_rank=0))
    assert report.diagnosis.causes == ("data",), str(report)
    assert "same batch" in report.diagnosis.why, str(report)


def test_other_data_on_one_rank_is_not_called_the_same_batch(cluster2):
    """Rank 1's targets shifted: the weights are right and the losses differ, so the data or the model's math
    differs, and the record cannot tell which."""
    from test_parity import dp_train

    report = ppkit.compare_runs(one_process(), cluster2.run(dp_train, bad_rank=1))
    assert set(report.diagnosis.causes) == {"data", "model"} and report.diagnosis.unsure, str(report)
    assert "same batch" not in report.diagnosis.why


# -- bf16 over more steps, Adam's amplified rounding --------------------------------------------------------

def test_a_1_5x_bug_at_step_6_under_bf16_is_flagged_and_named(cluster2):
    """A correct bf16 run's gradients stay within about 1e-2 of the float32 reference's at every step (measured over
    10 steps): a tolerance that grows as (1 + step) reached 0.44 at step 6 and called a 1.5x bug there a shape it
    could not tell. Every gradient of the step is 1.5x: that is named."""
    report = ppkit.compare_runs(one_process(steps=7), cluster2.run(dp_run, amp=True, late=(6, 1.5)))
    assert report.first is not None and report.first.step == 6, str(report)
    assert "1.5x the reference" in report.diagnosis.what, str(report)
    assert report.diagnosis.causes == ("scale_other",), str(report)


def test_a_correct_bf16_run_of_10_steps_equals_the_fp32_reference(cluster2):
    report = ppkit.compare_runs(one_process(steps=10), cluster2.run(dp_run, amp=True, late=(9, 1.0)))
    assert report.equal, str(report)


def attention_run(rank, world_size, lr_rank1=1.0):
    """Adam over Attention, DDP when there are ranks, parameters recorded; rank 1's learning rate x lr_rank1."""
    model = Attention()
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    rec = ppkit.ParityRecorder("params")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (lr_rank1 if rank == 1 else 1.0))
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 6, 8, generator=g), torch.randn(8, 4, generator=g)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        loss = F.mse_loss(model(x), y)
        loss.backward()
        rec.record(step, model, loss, mean_over=dist.group.WORLD if world_size > 1 else None)
        opt.step()
        opt.zero_grad()
    return rec.run


def test_a_correct_adam_run_with_attention_equals_the_reference_and_a_learning_rate_is_still_found(cluster2):
    """The key bias's update is float32's rounding divided by its own size: it may differ, by up to the updates
    the reference made, exactly where the reference's gradient was within rounding of zero; nowhere else."""
    ref = attention_run(0, 1)
    report = ppkit.compare_runs(ref, cluster2.run(attention_run))
    assert report.equal, str(report)
    assert "attn.in_proj_bias whose reference gradient was zero but for rounding" in str(report), str(report)
    wrong = ppkit.compare_runs(ref, cluster2.run(attention_run, lr_rank1=2.0))
    assert not wrong.equal and "lr" in wrong.diagnosis.causes, str(wrong)
    assert wrong.first.step == 1


# -- the second review: a correct bf16 AdamW run, a frozen parameter, a step that ran with lr 0, a run that never
# trains under bf16 (its reproducers: a LayerNorm MLP, DDP over the 2 ranks, autocast in bfloat16)

def ln_run(rank=0, world_size=1, width=64, opt="adamw", lr=1e-2, steps=3, what="params", bf16=True, bug=None,
           mlp=False):
    """Linear, LayerNorm (its bias starts at zero), Tanh, Linear; DDP where there are ranks. ``bug``: "frozen"
    (the first Linear's weight requires_grad=False), "never_step" (optimizer.step() never called), "lr0_rank1"
    (rank 1's lr is 0 at step 1: the step runs, Adam's state moves), "zero_rank1" (rank 1 zeroes its gradients
    before optimizer.step() at step 1); ``mlp``: test_parity's MLP (no LayerNorm) instead."""
    torch.manual_seed(0)
    model = make_model() if mlp else nn.Sequential(nn.Linear(8, width), nn.LayerNorm(width), nn.Tanh(),
                                                   nn.Linear(width, 4))
    if bug == "frozen":
        model[0].weight.requires_grad_(False)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = (torch.optim.AdamW(model.parameters(), lr=lr) if opt == "adamw"
           else torch.optim.SGD(model.parameters(), lr=lr))
    rec = ppkit.ParityRecorder(what)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
        loss = F.mse_loss(out.float(), y)
        loss.backward()
        rec.record(step, model, loss, mean_over=dist.group.WORLD if world_size > 1 else None)
        odd = rank == 1 and step == 1
        if bug == "lr0_rank1" and odd:
            opt.param_groups[0]["lr"] = 0.0
        if bug == "zero_rank1" and odd:
            opt.zero_grad(set_to_none=False)
        if bug != "never_step":
            opt.step()
        opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
    return rec.run


def test_a_correct_bf16_adamw_run_equals_the_fp32_reference(cluster2):
    """Adam's first update is lr x sign(g): an element whose gradient is small flips sign under bf16's rounding and
    moves 2 x lr the other way. Elements free under bf16's tolerance get the allowance, and no skipped step is
    read into a tolerance larger than one update."""
    report = ppkit.compare_runs(ln_run(bf16=False), cluster2.run(ln_run))
    assert report.equal, str(report)
    assert "skipped optimizer.step()" not in str(report)


def test_a_parameter_frozen_in_the_run_is_named_frozen(cluster2):
    report = ppkit.compare_runs(ln_run(what="grads", steps=1, bf16=False),
                                cluster2.run(ln_run, what="grads", steps=1, bf16=False, bug="frozen"))
    assert report.diagnosis.causes == ("frozen",), str(report)
    assert "requires_grad" in report.diagnosis.what, str(report)


def test_a_step_that_ran_with_lr_0_or_zero_gradients_is_not_called_a_skipped_step_alone(cluster2):
    """The step ran (Adam's moments and count moved; SGD's gradients were zeros): the parameters alone cannot
    tell it from a skipped step, so every candidate is listed."""
    for bug, opt in (("lr0_rank1", "adamw"), ("zero_rank1", "sgd")):
        runs = cluster2.run(ln_run, width=16, bf16=False, bug=bug, opt=opt)
        diagnosis = ppkit.compare_runs(ln_run(width=16, bf16=False, opt=opt), runs).diagnosis
        assert diagnosis.unsure and {"skipped_step", "lr", "step_grad", "zeroed"} <= set(diagnosis.causes), \
            (bug, diagnosis)


def test_a_zero_initialised_bias_that_never_moved_is_not_called_zeroed(cluster2):
    """A LayerNorm bias starts at zero: a run that never steps holds zeros that equal the reference's step 0."""
    report = ppkit.compare_runs(ln_run(width=16, lr=1e-3, steps=2, bf16=False),
                                cluster2.run(ln_run, width=16, lr=1e-3, steps=2, bug="never_step"))
    assert "all zeros" not in report.diagnosis.what, str(report)
    assert "detached" not in report.diagnosis.causes and "skipped_step" in report.diagnosis.causes, str(report)


def test_a_bf16_run_that_never_trains_is_not_called_equal_without_saying_it_cannot_tell(cluster2):
    """SGD at lr 0.01 over 20 steps: the reference moves less than bf16's tolerance, so a run whose optimizer
    never steps passes every comparison: the report must say that it cannot tell."""
    kw = dict(opt="sgd", lr=0.01, steps=20, mlp=True)
    report = ppkit.compare_runs(ln_run(bf16=False, **kw), cluster2.run(ln_run, bug="never_step", **kw))
    assert not report.equal or "cannot tell" in str(report), str(report)
    assert not report.equal or report.cannot_tell, str(report)


def test_a_difference_in_no_shape_does_not_name_start_weights_the_record_shows_equal():
    """The weights each rank kept at its first step equal the reference's: the words may not offer them."""
    report = ppkit.compare_runs(one_process(), noisy("grads", alike=True))
    assert "start weights" not in report.diagnosis.why, str(report)
    assert "init" not in report.diagnosis.causes, str(report)
