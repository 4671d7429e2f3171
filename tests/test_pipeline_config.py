"""Pipeline pieces that need no processes: configuration checks, the bubble model, timelines, and
the CLI's refusal of bad flags before it starts anything."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ppkit.cli import main as cli_main
from ppkit.errors import ConfigError
from ppkit.models.resnet import CUT_POINTS
from ppkit.pipeline.bubble import bubble_fraction, closed_form, predict
from ppkit.pipeline.rpc.config import (
    PipelineConfig,
    Placement,
    check_placement,
    num_microbatches,
    parse_placement,
    resnet_feature_size,
)
from ppkit.pipeline.timeline import Event, Timeline, union_length

# -- placement and configuration -------------------------------------------------------------------

def test_parse_placement():
    assert parse_placement("master:cpu,worker1:cuda:1") == (Placement("master", "cpu"),
                                                           Placement("worker1", "cuda:1"))
    assert parse_placement("worker2, worker1:cuda") == (Placement("worker2", "cpu"),
                                                       Placement("worker1", "cuda:0"))
    assert parse_placement([("worker1", "cpu"), "master"]) == (Placement("worker1"), Placement("master"))


@pytest.mark.parametrize("text, words", [
    ("gpu1:cpu,worker1:cpu", "unknown process 'gpu1'"),
    ("worker0:cpu,worker1:cpu", "unknown process 'worker0'"),
    ("worker1:tpu,worker2:cpu", "unknown device 'tpu'"),
    ("worker1:cuda:x,worker2:cpu", "unknown device 'cuda:x'"),
    ("worker1:cpu,,worker2:cpu", "cannot read placement"),
])
def test_parse_placement_refuses(text, words):
    with pytest.raises(ConfigError, match=words):
        parse_placement(text)


def test_num_microbatches():
    assert num_microbatches(120, 1) == 120
    assert num_microbatches(120, 8) == 15
    assert num_microbatches(10, 3) == 4  # 3 + 3 + 3 + 1
    assert num_microbatches(7, 7) == 1


@pytest.mark.parametrize("changes, words", [
    ({"microbatch_sizes": (0,)}, "micro-batch size 0 does not fit a batch of 32"),
    ({"microbatch_sizes": (1, 33)}, "micro-batch size 33 does not fit a batch of 32"),
    ({"microbatch_sizes": ()}, "at least one micro-batch size"),
    ({"microbatch_sizes": (2.5,)}, "whole number"),
    ({"cut": "layer9"}, "unknown cut point 'layer9'"),
    ({"cut": "layer4"}, "unknown cut point 'layer4'"),
    ({"batch_size": 0, "microbatch_sizes": (1,)}, "batch_size must be a whole number >= 1"),
    ({"num_batches": 0}, "num_batches must be"),
    ({"placement": "worker1:cpu"}, "cut into 2 shards, but the placement names 1"),
    ({"placement": "worker1,worker2,worker3"}, "cut into 2 shards, but the placement names 3"),
    ({"image_size": 32}, "last feature map is 1x1"),
    ({"image_size": 32, "batch_size": 9, "microbatch_sizes": (2,)}, "micro-batch of 1 image"),
])
def test_config_check_refuses(changes, words):
    with pytest.raises(ConfigError, match=words):
        PipelineConfig(**changes).check()


def test_config_accepts_and_counts_workers():
    config = PipelineConfig(placement="master:cpu,worker3:cpu").check()
    assert config.num_workers() == 3
    assert config.processes() == ["master", "worker3"]
    assert PipelineConfig(placement="master,master").num_workers() == 0
    # eval mode has no BatchNorm variance to compute: tiny images are fine
    PipelineConfig(image_size=32, train_mode=False).check()
    for cut in CUT_POINTS:
        PipelineConfig(cut=cut).check()


@pytest.mark.slow
def test_resnet_feature_size_matches_the_model():
    from ppkit.models.resnet import resnet50

    model = resnet50(0).eval()
    body = torch.nn.Sequential(*list(model.children())[:-2])
    for side in (32, 33, 64, 100):
        with torch.no_grad():
            assert body(torch.zeros(1, 3, side, side)).shape[-1] == resnet_feature_size(side)


def test_check_placement_against_a_world():
    names = ["master", "worker1", "worker2"]
    check_placement(parse_placement("worker1:cpu,worker2:cuda:0"), names, {"worker2": 1})
    with pytest.raises(ConfigError, match="names 'worker7', which is not in this RPC world"):
        check_placement(parse_placement("worker1,worker7"), names, {})
    with pytest.raises(ConfigError, match="asks for cuda:3, but worker1 has no CUDA device"):
        check_placement(parse_placement("worker1:cuda:3,worker2"), names, {"worker1": 0})
    with pytest.raises(ConfigError, match="asks for cuda:1, but worker2 has cuda:0..cuda:0"):
        check_placement(parse_placement("worker1,worker2:cuda:1"), names, {"worker2": 1})
    check_placement(parse_placement("worker1:cuda:5,worker2"), names)  # names only


# -- the bubble model --------------------------------------------------------------------------------

@pytest.mark.parametrize("forward, backward, m", [
    ([1.0, 1.0], [2.0, 2.0], 4),
    ([1.0, 3.0], [0.5, 2.0], 5),
    ([3.0, 1.0], [2.0, 0.5], 3),
    ([1.0, 2.0, 1.5], [2.0, 1.0, 3.0], 6),
    ([1.0, 2.0], [0.0, 0.0], 8),  # inference: forward only
])
def test_prediction_matches_closed_form(forward, backward, m):
    prediction = predict(forward, backward, m)
    assert prediction.total == pytest.approx(closed_form(forward, backward, m))
    # the schedule is feasible: a stage runs one micro-batch at a time
    for stage in range(len(forward)):
        events = sorted((e for e in prediction.schedule if e.stage == stage), key=lambda e: e.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(events, events[1:]))
    # and each micro-batch visits the stages in order (forward) and in reverse (backward)
    for mb in range(m):
        fwd = sorted((e for e in prediction.schedule if e.microbatch == mb and e.phase == "forward"),
                     key=lambda e: e.stage)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(fwd, fwd[1:]))


def test_bubble_fraction_for_equal_stages():
    for stages in (2, 3, 4):
        for m in (1, 2, 8, 120):
            prediction = predict([1.0] * stages, [2.0] * stages, m)
            assert prediction.bubble == pytest.approx(bubble_fraction(stages, m))
    assert bubble_fraction(2, 1) == pytest.approx(0.5)
    assert bubble_fraction(2, 120) == pytest.approx(1 / 121)
    with pytest.raises(ConfigError):
        bubble_fraction(2, 0)


def test_one_microbatch_is_sequential():
    prediction = predict([1.0, 2.0], [3.0, 4.0], 1)
    assert prediction.total == pytest.approx(prediction.sequential) == pytest.approx(10.0)


# -- timelines -------------------------------------------------------------------------------------

def test_union_length_counts_overlaps_once():
    assert union_length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert union_length([(0, 4), (1, 2)]) == pytest.approx(4.0)
    assert union_length([]) == 0.0


def test_timeline_from_raw_events():
    raw = [  # (stage, step, microbatch, phase, start, end), absolute times
        (0, 7, 0, "forward", 100.0, 101.0), (0, 7, 1, "forward", 101.0, 102.0),
        (1, 7, 0, "forward", 101.0, 103.0), (1, 7, 1, "forward", 103.0, 105.0),
        (1, 7, 0, "backward", 105.0, 108.0), (1, 7, 1, "backward", 106.0, 109.0),  # interleaved
        (0, 6, 0, "forward", 50.0, 51.0),  # an older step: dropped
    ]
    timeline = Timeline.from_raw(raw, ["a", "b"], 2, origin=100.0, step=7)
    assert len(timeline.events) == 6
    assert timeline.select(0, "forward")[0] == Event(0, 0, "forward", 0.0, 1.0)
    assert timeline.stage_time(1, "forward") == pytest.approx(2.0)
    assert timeline.busy(1, "backward") == pytest.approx(4.0)  # 105..109, overlap counted once
    assert timeline.stage_time(1, "backward") == pytest.approx(2.0)
    assert timeline.span() == pytest.approx(9.0)
    assert timeline.has_backward()


# -- the CLI refuses bad flags before starting anything ------------------------------------------

@pytest.mark.parametrize("flags, words", [
    (["--microbatch-sizes", "0"], "micro-batch size 0 does not fit"),
    (["--batch-size", "8", "--microbatch-sizes", "1", "16"], "micro-batch size 16 does not fit a batch of 8"),
    (["--placement", "worker1:cpu,worker9x:cpu"], "unknown process 'worker9x'"),
    (["--cut", "layer7"], "unknown cut point 'layer7'"),
    (["--plot", "/nonexistent-dir/x.png"], "does not exist"),
    (["--plot", "sweep.txt"], "end the file name with"),
    (["--num-batches", "0"], "num_batches must be"),
    (["--listen", "127.0.0.1:0", "--placement", "master,master"], "every shard on master"),
    (["--num-microbatches", "12"], "cannot be cut into 12 micro-batches"),
    (["--num-microbatches", "64"], "does not fit a batch of 32"),
    (["--stage-threads", "zero"], "stage threads 'zero'"),
    (["--cut", "auto", "--schedule", "gpipe"], "--cut auto works with --schedule rpc only"),
    (["--batch-size", "0"], "batch_size must be"),
])
def test_cli_bad_flags(flags, words, capsys, monkeypatch):
    import ppkit

    monkeypatch.setattr(ppkit, "start_rpc", lambda *a, **k: pytest.fail("started a world"), raising=False)
    assert cli_main(["pipeline", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and err.startswith("ppkit pipeline: error:")


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="this machine has a cuda:3")
def test_cli_refuses_missing_device(capsys):
    assert cli_main(["pipeline", "--placement", "worker1:cuda:3,worker2:cpu"]) == 2
    assert "asks for cuda:3" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_bad_flags_in_a_real_process():
    for flags in (["--microbatch-sizes", "0"], ["--batch-size", "many"]):
        proc = subprocess.run([sys.executable, "-m", "ppkit", "pipeline", *flags],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith("ppkit pipeline: error:")
