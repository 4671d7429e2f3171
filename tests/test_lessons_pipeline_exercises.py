"""The pipeline notebooks' exercise checkers accept right answers and reject wrong ones precisely."""

from __future__ import annotations

import math

import pytest
import torch

from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import check_pipeline as px

# -- lesson 5 ----------------------------------------------------------------------------------

CHANNELS = {"stem": 64, "layer1": 256, "layer2": 512, "layer3": 1024}
HALVINGS = {"stem": 2, "layer1": 2, "layer2": 3, "layer3": 4}


def activation_shape(cut, batch_size, image_size):
    side = image_size
    for _ in range(HALVINGS[cut]):
        side = (side + 1) // 2  # a stride-2 step rounds up
    return (batch_size, CHANNELS[cut], side, side)


@pytest.mark.slow
def test_activation_shape_accepts_the_right_answer(capsys):
    report = px.check_activation_shape(activation_shape)
    assert report.passed and len(report.cases) == 4
    assert "activation shape: passed all 4 cases" in capsys.readouterr().out


@pytest.mark.slow
def test_activation_reference_is_the_real_forward():
    first, _ = px.split_resnet50(px.resnet50(0).eval(), "layer2")
    with torch.no_grad():
        real = first(torch.zeros(2, 3, 97, 97)).shape
    assert px.activation_shape_of("layer2", 2, 97) == tuple(real) == (2, 512, 13, 13)


@pytest.mark.slow
def test_activation_shape_rejects_rounding_down():
    def floors(cut, batch_size, image_size):
        return (batch_size, CHANNELS[cut], image_size >> HALVINGS[cut], image_size >> HALVINGS[cut])

    with pytest.raises(ExerciseFailed) as err:
        px.check_activation_shape(floors)
    failures = err.value.failures
    assert all("97x97" in f for f in failures)  # the even sizes are right
    assert "cut after 'layer2', batch 1, 97x97 images: expected (1, 512, 13, 13), got (1, 512, 12, 12)" \
        in failures[4]
    assert "rounds *up*" in failures[0]


def test_activation_shape_rejects_wrong_channels_batch_and_types():
    def wrong(cut, batch_size, image_size):
        if cut == "layer1":
            return (batch_size, 64, image_size // 4, image_size // 4)  # the stem's channels
        if cut == "layer3":
            return "big"
        if cut == "stem" and batch_size == 3:
            raise KeyError(cut)
        return activation_shape(cut, 1, image_size)  # per image, not per batch

    with pytest.raises(ExerciseFailed) as err:
        px.check_activation_shape(wrong, image_sizes=(64,))
    failures = err.value.failures
    assert failures == [
        "cut after 'stem', batch 3, 64x64 images: your function raised KeyError: 'stem'",
        "cut after 'layer1', batch 1, 64x64 images: expected (1, 256, 16, 16), got (1, 64, 16, 16) "
        "(channels: the stem gives 64, and layer1..layer3 give 256, 512, 1024)",
        "cut after 'layer1', batch 3, 64x64 images: expected (3, 256, 16, 16), got (3, 64, 16, 16) "
        "(channels: the stem gives 64, and layer1..layer3 give 256, 512, 1024)",
        "cut after 'layer2', batch 3, 64x64 images: expected (3, 512, 8, 8), got (1, 512, 8, 8) "
        "(the first number is the batch size)",
        "cut after 'layer3', batch 1, 64x64 images: expected a shape such as (1, 1024, 4, 4), got str 'big'",
        "cut after 'layer3', batch 3, 64x64 images: expected a shape such as (3, 1024, 4, 4), got str 'big'",
    ]
    assert "6 problem(s) in 4 cases" in str(err.value)


@pytest.mark.slow
def test_activation_shape_rejects_a_non_shape():
    with pytest.raises(ExerciseFailed, match=r"batch 1, 32x32 images: expected a shape such as "
                                             r"\(1, 64, 8, 8\), got int 4"):
        px.check_activation_shape(lambda cut, b, s: 4)


# -- lesson 6 ----------------------------------------------------------------------------------

def pipeline_time(forward_times, backward_times, batch_size, microbatch_size):
    m = -(-batch_size // microbatch_size)
    total = sum(forward_times) + (m - 1) * max(forward_times)
    if any(backward_times):
        total += sum(backward_times) + (m - 1) * max(backward_times)
    return total


def test_pipeline_time_accepts_the_right_answer(capsys):
    report = px.check_pipeline_time(pipeline_time)
    assert report.passed and len(report.cases) == len(px.PIPELINE_CASES)
    assert "pipeline time: passed all 6 cases" in capsys.readouterr().out


def test_pipeline_time_reference_matches_the_closed_form():
    for f, b, batch, size in px.PIPELINE_CASES:
        assert math.isclose(px._gpipe_total(f, b, px.num_microbatches(batch, size)),
                            pipeline_time(f, b, batch, size))


def test_pipeline_time_names_a_floor_division():
    def floors(f, b, batch, size):
        return pipeline_time(f, b, batch - batch % size, size)

    with pytest.raises(ExerciseFailed) as err:
        px.check_pipeline_time(floors)
    assert err.value.failures == [
        "forward [1.0, 2.0], backward [2.0, 4.0], batch 120, micro-batch size 7 (18 micro-batches): "
        "expected 111 s, got 105 s (the value for batch_size // microbatch_size micro-batches: the last, "
        "smaller micro-batch is one too (round up))"]


def test_pipeline_time_names_size_for_count_no_overlap_and_missing_backward():
    def size_as_count(f, b, batch, size):
        return pipeline_time(f, b, size, 1)

    def no_overlap(f, b, batch, size):
        return -(-batch // size) * (sum(f) + sum(b))

    def forward_only(f, b, batch, size):
        return pipeline_time(f, [0.0] * len(b), batch, size)

    with pytest.raises(ExerciseFailed) as err:
        px.check_pipeline_time(size_as_count)
    assert len(err.value.failures) == 6
    assert ("forward [1.0, 2.0], backward [2.0, 4.0], batch 10, micro-batch size 10 (1 micro-batches): "
            "expected 9 s, got 63 s (the value for microbatch_size micro-batches: that is a size") \
        in err.value.failures[-2]
    with pytest.raises(ExerciseFailed) as err:
        px.check_pipeline_time(no_overlap)
    assert "expected 31.5 s, got 56 s (that is the time with no overlap" in err.value.failures[0]
    with pytest.raises(ExerciseFailed) as err:
        px.check_pipeline_time(forward_only)
    assert len(err.value.failures) == 5  # the forward-only case is right
    assert "expected 31.5 s, got 9 s (that is the forward alone" in err.value.failures[0]


def test_pipeline_time_rejects_a_non_number():
    with pytest.raises(ExerciseFailed, match=r"expected a number of seconds \(31.5\), got str 'soon'"):
        px.check_pipeline_time(lambda f, b, batch, size: "soon")


# -- lesson 8 ----------------------------------------------------------------------------------

def microbatches_held(schedule, num_stages, num_microbatches):
    if schedule == "gpipe":
        return [num_microbatches] * num_stages
    return [min(num_microbatches, num_stages - s) for s in range(num_stages)]


def test_microbatches_held_accepts_the_right_answer(capsys):
    report = px.check_microbatches_held(microbatches_held)
    assert report.passed and len(report.cases) == 2 * len(px.HELD_SHAPES)
    assert "micro-batches held: passed all 12 cases (gpipe 2x4; gpipe 2x1;" in capsys.readouterr().out


def test_microbatches_held_rejects_each_mistake_with_its_case():
    def uncapped(schedule, num_stages, m):
        return [num_stages - s for s in range(num_stages)] if schedule == "1f1b" else [m] * num_stages

    with pytest.raises(ExerciseFailed) as err:
        px.check_microbatches_held(uncapped)
    assert err.value.failures == [
        "1f1b, 2 stages, 1 micro-batches: expected [1, 1], got [2, 1] (a stage cannot hold more "
        "micro-batches than there are: cap it at num_microbatches)",
        "1f1b, 4 stages, 2 micro-batches: expected [2, 2, 2, 1], got [4, 3, 2, 1] (a stage cannot hold "
        "more micro-batches than there are: cap it at num_microbatches)",
        "1f1b, 5 stages, 3 micro-batches: expected [3, 3, 3, 2, 1], got [5, 4, 3, 2, 1] (a stage cannot "
        "hold more micro-batches than there are: cap it at num_microbatches)",
    ]

    def reversed_1f1b(schedule, num_stages, m):
        return microbatches_held(schedule, num_stages, m)[::-1]

    with pytest.raises(ExerciseFailed) as err:
        px.check_microbatches_held(reversed_1f1b)
    assert err.value.failures[0] == ("1f1b, 2 stages, 4 micro-batches: expected [2, 1], got [1, 2] "
                                     "(reversed: the first stage runs the most forwards ahead, the last "
                                     "stage the fewest)")

    def gpipe_like_1f1b(schedule, num_stages, m):
        return microbatches_held("1f1b", num_stages, m)

    with pytest.raises(ExerciseFailed) as err:
        px.check_microbatches_held(gpipe_like_1f1b)
    assert err.value.failures[0] == ("gpipe, 2 stages, 4 micro-batches: expected [4, 4], got [2, 1] "
                                     "(GPipe runs every forward before any backward)")
    with pytest.raises(ExerciseFailed, match=r"gpipe, 2 stages, 4 micro-batches: expected one number per "
                                             r"stage such as \[4, 4\], got NoneType None"):
        px.check_microbatches_held(lambda schedule, s, m: None)


def test_checkers_want_a_function():
    for check in (px.check_activation_shape, px.check_pipeline_time, px.check_microbatches_held):
        with pytest.raises(ConfigError, match="pass your function itself"):
            check(42)
