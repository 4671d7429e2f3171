"""The ResNet50 shards as torch.distributed.pipelining stages: same numbers as one model, and
failures that end in a clear error instead of a hang."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ppkit
from ppkit.pipeline import pipelining as pp

BATCH, MICROBATCHES, IMAGE = 8, 4, 32
RUN_TIMEOUT = 180  # the machine is shared; a pipeline error must come from p2p_timeout, well before this


@pytest.fixture(scope="module")
def batch():
    return pp.make_batch(BATCH, IMAGE)


@pytest.fixture(scope="module")
def reference(batch):
    return pp.reference_step(*batch)


@pytest.fixture(scope="module")
def runs(cluster2, batch):
    """One GPipe and one 1F1B step of the same batch, on the module's 2-rank cluster."""
    return {name: pp.merge_ranks(cluster2.run(pp.train_step, *batch, schedule=name,
                                              num_microbatches=MICROBATCHES, timeout=RUN_TIMEOUT))
            for name in pp.SCHEDULES}


# -- pieces that need no cluster ---------------------------------------------------------------
def test_microbatch_size_must_divide_the_batch():
    assert pp.microbatch_size_of(8, 4) == 2
    with pytest.raises(ppkit.ConfigError, match="equal micro-batches"):
        pp.microbatch_size_of(8, 3)
    with pytest.raises(ppkit.ConfigError):
        pp.microbatch_size_of(8, 0)


def test_bad_arguments_are_refused_before_anything_starts(batch):
    with pytest.raises(ppkit.ConfigError, match="unknown schedule 'zb'"):
        pp.train_step(0, 2, *batch, schedule="zb")
    with pytest.raises(ppkit.ConfigError, match="2-rank cluster"):
        pp.train_step(0, 3, *batch)
    with pytest.raises(ppkit.ConfigError, match="cut point"):
        pp.train_step(0, 2, *batch, cut="layer9")
    with pytest.raises(ppkit.ConfigError, match="num_threads"):
        pp.train_step(0, 2, *batch, num_threads=0)


def test_stage_example_tensors_are_the_shapes_at_the_cut():
    x, act, logits = pp.stage_example_tensors("layer2", 2, 32)
    assert x.shape == (2, 3, 32, 32) and not x.requires_grad
    assert act.shape == (2, 512, 4, 4) and act.requires_grad  # 32 / 8 after stem and layer2
    assert logits.shape == (2, pp.NUM_CLASSES)
    assert {t.device.type for t in (x, act, logits)} == {"meta"}


def test_activation_meter_counts_saved_tensors_until_backward_frees_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    meter = pp.ActivationMeter(model)
    x = torch.randn(8, 16)
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        out = model(x)
    # saved: x (for the first weight's grad), tanh's output (for tanh and the second weight);
    # the weights themselves are not activations
    assert meter.current == meter.peak == (8 * 16 + 8 * 32) * 4
    out.sum().backward()
    assert meter.current == 0 and meter.peak == (8 * 16 + 8 * 32) * 4
    meter.reset_peak()
    assert meter.peak == 0


def test_grad_difference():
    a = [{"w": torch.tensor([1.0, -2.0])}]
    assert pp.grad_difference(a, a) == 0
    assert pp.grad_difference([{"w": torch.tensor([1.0, -1.5])}], a) == pytest.approx(0.25)
    with pytest.raises(ppkit.ConfigError, match="different parameters"):
        pp.grad_difference([{"v": torch.zeros(2)}], a)


# -- the pipeline on a real 2-rank gloo cluster ------------------------------------------------
@pytest.mark.parametrize("schedule", list(pp.SCHEDULES))
def test_loss_and_gradients_equal_one_local_model(runs, reference, schedule):
    run = runs[schedule]
    assert run["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert pp.grad_difference(run["grads"], reference["grads"]) < 1e-5
    # and not trivially: the gradients are not all zero
    assert max(g.abs().max().item() for stage in run["grads"] for g in stage.values()) > 0


def test_each_stage_runs_every_microbatch_forward_and_backward(runs):
    for run in runs.values():
        for stage in range(2):
            kinds = [(kind, mb) for s, kind, mb, _, _ in run["timeline"] if s == stage]
            assert sorted(kinds) == sorted((k, mb) for k in "FB" for mb in range(MICROBATCHES))


def _order(run, stage):
    return [f"{kind}{mb}" for s, kind, mb, start, _ in sorted(run["timeline"], key=lambda e: e[3])
            if s == stage]


def test_gpipe_runs_all_forwards_first_and_1f1b_interleaves(runs):
    assert _order(runs["gpipe"], 0) == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    # stage 0 of 2 warms up with 2 forwards, then alternates one backward, one forward
    assert _order(runs["1f1b"], 0) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert _order(runs["1f1b"], 1) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


def test_1f1b_keeps_fewer_microbatches_of_activations_alive(runs):
    gpipe, one_f_one_b = runs["gpipe"]["peak_activation_bytes"], runs["1f1b"]["peak_activation_bytes"]
    # GPipe holds all 4 micro-batches; 1F1B holds 2 on stage 0 (its warm-up) and 1 on stage 1
    assert gpipe[0] == 2 * one_f_one_b[0] > 0
    assert gpipe[1] == 4 * one_f_one_b[1] > 0
