"""The ResNet50 shards as torch.distributed.pipelining stages: same numbers as one model, and
failures that end in a clear error instead of a hang."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ppkit
from ppkit.pipeline.bubble import predict
from ppkit.pipeline.schedules import bubble_model, report, verify
from ppkit.pipeline.schedules import compare as cmp
from ppkit.pipeline.schedules import stage as pp
from ppkit.pipeline.schedules.memory import ActivationMeter

BATCH, MICROBATCHES, IMAGE = 8, 4, 32
RUN_TIMEOUT = 180  # the machine is shared; a pipeline error must come from p2p_timeout, well before this


@pytest.fixture(scope="module")
def batch():
    return pp.make_batch(BATCH, IMAGE)


@pytest.fixture(scope="module")
def reference(batch):
    return verify.reference_step(*batch)


@pytest.fixture(scope="module")
def runs(cluster2, batch):
    """One GPipe and one 1F1B step of the same batch, on the module's 2-rank cluster."""
    return {name: cmp.run_schedule(cluster2, *batch, name, num_microbatches=MICROBATCHES,
                                   timeout=RUN_TIMEOUT) for name in pp.SCHEDULES}


@pytest.fixture(scope="module")
def rpc_run(batch):
    """The same step through the RPC pipeline (this process is the RPC master)."""
    import torch.distributed.rpc as rpc

    from ppkit.pipeline.rpc import PipelineModel

    with ppkit.start_rpc(num_workers=2) as world, PipelineModel("worker1:cpu,worker2:cpu") as model:
        names = ("worker1", "worker2")
        threads = [rpc.rpc_sync(name, cmp._set_num_threads, args=(3,)) for name in names]
        run = cmp.rpc_step(model, *batch, MICROBATCHES, steps=2)
        after = [rpc.rpc_sync(name, cmp._set_num_threads, args=(t,)) for name, t in zip(names, threads)]
        assert after == [3, 3]  # rpc_step ran its stages on one thread each, then put 3 back
        assert world.state == "ready"
    return run


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
    with pytest.raises(ppkit.ConfigError, match="p2p_timeout"):
        pp.train_step(0, 2, *batch, p2p_timeout=0)
    with pytest.raises(ppkit.ConfigError, match="learning rate"):
        pp.train_step(0, 2, *batch, lr=0)
    with pytest.raises(ppkit.ConfigError, match="unknown loss 'l1'"):
        pp.train_step(0, 2, *batch, loss="l1")
    with pytest.raises(ppkit.ConfigError, match="Schedule1F1B cannot take num_microbatches=1 on 2 ranks"):
        pp.train_step(0, 2, *batch, schedule="1f1b", num_microbatches=1)


def test_stage_example_tensors_are_the_shapes_at_the_cut():
    x, act, logits = pp.stage_example_tensors("layer2", 2, 32)
    assert x.shape == (2, 3, 32, 32) and not x.requires_grad
    assert act.shape == (2, 512, 4, 4) and act.requires_grad  # 32 / 8 after stem and layer2
    assert logits.shape == (2, pp.NUM_CLASSES)
    assert {t.device.type for t in (x, act, logits)} == {"meta"}


def test_activation_meter_counts_saved_tensors_until_backward_frees_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    meter = ActivationMeter(model)
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
    assert verify.grad_difference(a, a) == 0
    assert verify.grad_difference([{"w": torch.tensor([1.0, -1.5])}], a) == pytest.approx(0.25)
    with pytest.raises(ppkit.ConfigError, match="different parameters"):
        verify.grad_difference([{"v": torch.zeros(2)}], a)


@pytest.mark.parametrize("times", [([1.0, 1.0], [2.0, 2.0]), ([0.3, 1.1], [0.9, 2.5]),
                                   ([2.0, 0.5], [1.0, 0.2])])
def test_ideal_gpipe_timeline_agrees_with_the_rpc_pipelines_bubble_model(times):
    forward, backward = times
    events = bubble_model.ideal_timeline(bubble_model.schedule_orders("gpipe", 2, 5), forward, backward)
    assert max(e.end for e in events) == pytest.approx(predict(forward, backward, 5).total)


@pytest.mark.parametrize("stages, m", [(2, 2), (2, 4), (2, 8), (3, 6), (4, 4)])
def test_ideal_1f1b_with_equal_stages_has_the_textbook_bubble(stages, m):
    f, b = 1.0, 2.0
    events = bubble_model.ideal_timeline(bubble_model.schedule_orders("1f1b", stages, m), [f] * stages, [b] * stages)
    total = max(e.end for e in events)
    assert total == pytest.approx((m + stages - 1) * (f + b))
    idle = 1 - sum(e.duration for e in events) / (stages * total)
    assert idle == pytest.approx((stages - 1) / (m + stages - 1))  # = bubble / (bubble + work)
    # the bubble against the work alone is the (p - 1) / m of the GPipe and Megatron papers
    assert idle / (1 - idle) == pytest.approx((stages - 1) / m)


def test_orders_that_wait_on_each_other_are_refused():
    deadlock = [[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]
    with pytest.raises(ppkit.ConfigError, match="deadlock"):
        bubble_model.ideal_timeline(deadlock, [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(ppkit.ConfigError, match="unknown schedule"):
        bubble_model.schedule_orders("interleaved", 2, 4)


# -- the pipeline on a real 2-rank gloo cluster ------------------------------------------------
@pytest.mark.parametrize("schedule", list(pp.SCHEDULES))
def test_loss_and_gradients_equal_one_local_model(runs, reference, schedule):
    run = runs[schedule]
    assert run.loss == pytest.approx(reference["loss"], rel=verify.LOSS_RTOL)
    assert verify.grad_difference(run.grads, reference["grads"]) < verify.GRAD_RTOL
    # and not trivially: the gradients are not all zero
    assert max(g.abs().max().item() for stage in run.grads for g in stage.values()) > 0


def test_the_rpc_pipeline_computes_the_same_loss_and_gradients(rpc_run, reference):
    assert rpc_run.schedule == "rpc" and len(rpc_run.step_times) == 2
    assert rpc_run.loss == pytest.approx(reference["loss"], rel=verify.LOSS_RTOL)
    assert verify.grad_difference(rpc_run.grads, reference["grads"]) < verify.GRAD_RTOL
    assert sorted((e.stage, e.phase, e.microbatch) for e in rpc_run.timeline.events) == sorted(
        (s, p, mb) for s in range(2) for p in ("forward", "backward") for mb in range(MICROBATCHES))
    table = report.format_table({"rpc": rpc_run})
    assert "not measured" in table  # no activation meter inside the RPC stages


def test_each_stage_runs_every_microbatch_forward_and_backward(runs):
    for run in runs.values():
        for stage in range(2):
            done = sorted((e.phase, e.microbatch) for e in run.timeline.select(stage))
            assert done == sorted((p, mb) for p in ("forward", "backward") for mb in range(MICROBATCHES))


def _order(run, stage):
    return [f"{e.phase[0].upper()}{e.microbatch}" for e in sorted(run.timeline.select(stage),
                                                                  key=lambda e: e.start)]


def test_gpipe_runs_all_forwards_first_and_1f1b_interleaves(runs):
    assert _order(runs["gpipe"], 0) == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    # stage 0 of 2 warms up with 2 forwards, then alternates one backward, one forward
    assert _order(runs["1f1b"], 0) == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]
    assert _order(runs["1f1b"], 1) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    # and the bubble model runs the same orders
    for name, run in runs.items():
        orders = bubble_model.schedule_orders(name, 2, MICROBATCHES)
        assert [[f"{k}{mb}" for k, mb in order] for order in orders] == [_order(run, 0), _order(run, 1)]


def test_measured_runs_have_step_times_idle_share_and_an_ideal_timeline(runs):
    for run in runs.values():
        assert len(run.step_times) == 1 and run.step_time == run.step_times[0] > 0
        assert 0 <= run.idle_share() < 1
        model = run.prediction()
        assert sorted((e.stage, e.phase, e.microbatch) for e in model.schedule) == sorted(
            (e.stage, e.phase, e.microbatch) for e in run.timeline.events)
        assert model.total == max(e.end for e in model.schedule) > 0 and 0 <= model.bubble < 1
    table = report.format_table(runs)
    assert "gpipe" in table and "1f1b" in table and "MiB" in table


def test_1f1b_keeps_fewer_microbatches_of_activations_alive(runs):
    gpipe, one_f_one_b = runs["gpipe"].peak_activation_bytes, runs["1f1b"].peak_activation_bytes
    # GPipe holds all 4 micro-batches; 1F1B holds 2 on stage 0 (its warm-up) and 1 on stage 1
    assert gpipe[0] == 2 * one_f_one_b[0] > 0
    assert gpipe[1] == 4 * one_f_one_b[1] > 0
