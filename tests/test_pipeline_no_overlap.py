"""The no-overlap reference at the same micro-batch size: the very update of the pipelined step, with
the micro-batches run one after the other; and one stage timed alone per image."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ppkit
from ppkit.models.resnet import resnet50, split_resnet50
from ppkit.pipeline.bubble import closed_form, predict_from_timeline
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.rpc.no_overlap import overlap_bound, solo_seconds_per_image, train_no_overlap
from ppkit.pipeline.rpc.sweep import RunResult, build_model, train_batches
from ppkit.pipeline.timeline import Event, Timeline

CONFIG = PipelineConfig(batch_size=6, image_size=40, num_batches=1, microbatch_sizes=(2,),
                        placement="worker1:cpu,worker2:cpu", cut="layer1", train_mode=False).check()


@pytest.fixture(scope="module")
def world():
    with ppkit.start_rpc(num_workers=2) as world:
        yield world


def _update(train, size: int) -> tuple[list[dict], object]:
    """What one training step at micro-batch ``size`` changes in every shard, and the step's run."""
    before = [{k: v.clone() for k, v in shard.state_dict().items()}
              for shard in split_resnet50(resnet50(CONFIG.seed), CONFIG.cut)]
    model, optimizer = build_model(CONFIG)
    try:
        run = train(model, optimizer, CONFIG, size)
        after = model.state_dicts()
    finally:
        model.close()
    return [{k: a[k] - b[k] for k in b if b[k].is_floating_point()} for a, b in zip(after, before)], run


@pytest.mark.slow
def test_no_overlap_makes_the_pipelined_update_one_microbatch_at_a_time(world):
    pipelined, _ = _update(train_batches, 2)
    alone, run = _update(train_no_overlap, 2)
    worst = max((p[k] - a[k]).abs().max().item() for p, a in zip(pipelined, alone) for k in p)
    scale = max(p[k].abs().max().item() for p in pipelined for k in p)
    assert scale > 0 and worst <= 1e-4 * scale  # the same micro-batches, summed in another order
    # nothing overlapped: each micro-batch went forward through both stages and back before the next
    events = sorted(run.timeline.events, key=lambda e: e.start)
    assert [(e.microbatch, e.stage, e.phase) for e in events] == [
        (mb, stage, phase) for mb in range(3)
        for stage, phase in ((0, "forward"), (1, "forward"), (1, "backward"), (0, "backward"))]
    assert all(a.end <= b.start + 1e-3 for a, b in zip(events, events[1:]))
    assert run.num_microbatches == 3 and run.microbatch_size == 2


def test_overlap_bound_is_the_step_over_the_ideal_pipeline_of_its_own_stage_times():
    # two stages, 3 micro-batches one at a time: forward 1 and 2 s, backward 2 and 3 s per micro-batch
    times = {(0, "forward"): 1.0, (1, "forward"): 2.0, (1, "backward"): 3.0, (0, "backward"): 2.0}
    events, clock = [], 0.0
    for mb in range(3):
        for stage, phase in ((0, "forward"), (1, "forward"), (1, "backward"), (0, "backward")):
            events.append(Event(stage, mb, phase, clock, clock + times[(stage, phase)]))
            clock += times[(stage, phase)] + 0.5  # and half a second of messages after each
    timeline = Timeline(events, ["stage 1", "stage 2"], 3)
    run = RunResult(2, 3, [clock], 6, timeline, predict_from_timeline(timeline))
    ideal = closed_form([1.0, 2.0], [2.0, 3.0], 3)  # 3 + 2 x 2 + 5 + 2 x 3 = 18 s
    assert run.prediction.total == pytest.approx(ideal) == pytest.approx(18.0)
    assert overlap_bound(run, rest_seconds=0.25) == pytest.approx(clock / (0.25 + 18.0))


def test_solo_seconds_per_image_times_one_shard_and_restores_the_threads():
    shard = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    threads = torch.get_num_threads()
    per_image = solo_seconds_per_image(shard, (8,), [1, 4], repeats=2)
    assert list(per_image) == [1, 4] and all(t > 0 for t in per_image.values())
    assert torch.get_num_threads() == threads
    assert all(p.grad is None for p in shard.parameters())
    with pytest.raises(ppkit.ConfigError, match="whole numbers of images"):
        solo_seconds_per_image(shard, (8,), [0])
