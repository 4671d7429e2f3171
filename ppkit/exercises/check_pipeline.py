"""Exercises that ppkit checks for the pipeline notebooks; each runs in the kernel in well under a second.

    check_activation_shape(fn)   lesson 5: the tensor shard 1 sends to shard 2, for every cut
    check_pipeline_time(fn)      lesson 6: the ideal GPipe step time from stage times and sizes
    check_microbatches_held(fn)  lesson 8: how many micro-batches' activations each stage keeps
    check_best_num_microbatches(fn)  lesson 6: the bottom of the U-curve from stage times and overhead

Each compares your function with ppkit's own model of the same thing (real shapes from the split
ResNet50 on the meta device, ``ppkit.pipeline.bubble.predict``, the schedules' orders of work in
``ppkit.pipeline.schedules.bubble_model``), returns a ``CheckReport`` when every case agrees and raises
``ExerciseFailed`` otherwise, naming the case, what was expected and what your function returned.
"""

from __future__ import annotations

import functools
import math

import torch

from ppkit.checks import check_callable
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.models.resnet import CUT_POINTS, resnet50, split_resnet50
from ppkit.pipeline.bubble import predict
from ppkit.pipeline.rpc.config import num_microbatches
from ppkit.pipeline.rpc.ucurve import best_count, step_model
from ppkit.pipeline.schedules.bubble_model import schedule_orders

# -- lesson 5: the activation at the cut -------------------------------------------------------

ACTIVATION_BATCHES = (1, 3)
IMAGE_SIZES = (32, 64, 97, 224)


def _as_sequence(got, convert):
    """``convert(got)`` (tuple or list) for anything iterable except a string, else None."""
    if isinstance(got, str):
        return None
    try:
        return convert(got)
    except TypeError:
        return None


def _as_tuple(got) -> tuple | None:
    return _as_sequence(got, tuple)


def _as_list(got) -> list | None:
    return _as_sequence(got, list)


@functools.lru_cache(maxsize=1)
def _meta_resnet50():
    # meta tensors carry shapes only: the real forward's shapes at no compute and no memory
    with torch.device("meta"):
        return resnet50(0).eval()


def activation_shape_of(cut: str, batch_size: int, image_size: int) -> tuple[int, ...]:
    """The shape shard 1 of ``split_resnet50(model, cut)`` really outputs for that batch."""
    first, _ = split_resnet50(_meta_resnet50(), cut)
    with torch.no_grad():
        return tuple(first(torch.empty(batch_size, 3, image_size, image_size, device="meta")).shape)


def _shape_hint(got: tuple, want: tuple, image_size: int) -> str:
    if len(got) != len(want):
        return f" (a shape of {len(want)} numbers: batch, channels, height, width)"
    if got == (want[0], want[2], want[3], want[1]):
        return (" (that is channels last, (batch, height, width, channels), TensorFlow's order; PyTorch's tensors are "
                "(batch, channels, height, width))")
    if got[0] != want[0]:
        return " (the first number is the batch size)"
    if got[1] != want[1]:
        return " (channels: the stem gives 64, and layer1..layer3 give 256, 512, 1024)"
    if image_size % 2 and got[2:] != want[2:]:
        return (" (with an odd image size every stride-2 step rounds *up*: the stem's convolution and"
                " max-pool, and the first block of layer2 and of layer3, each give ceil(h / 2))")
    return " (height and width halve twice in the stem, then once in layer2 and once in layer3)"


def check_activation_shape(fn, batch_sizes=ACTIVATION_BATCHES, image_sizes=IMAGE_SIZES) -> CheckReport:
    """Check ``fn(cut, batch_size, image_size) -> shape``: the shape of the tensor shard 1 sends to
    shard 2 when torchvision's ResNet50 is cut after ``cut`` and fed square RGB images, for every cut
    point in ``CUT_POINTS``."""
    check_callable(fn, "fn(cut, batch_size, image_size)")
    report = CheckReport("activation shape")
    for cut in CUT_POINTS:
        report.case(f"cut after {cut}: batches {list(batch_sizes)} x images {list(image_sizes)}")
        for batch_size in batch_sizes:
            for image_size in image_sizes:
                label = f"cut after {cut!r}, batch {batch_size}, {image_size}x{image_size} images"
                want = activation_shape_of(cut, batch_size, image_size)
                got = report.answer(label, fn, (cut, batch_size, image_size), _as_tuple, f"a shape such as {want}")
                if got is not None and got != want:
                    report.fail(f"{label}: expected {want}, got {got}" + _shape_hint(got, want, image_size))
    return raise_or_report(report)


# -- lesson 6: the ideal GPipe step ------------------------------------------------------------

# (forward_times, backward_times, batch_size, microbatch_size), times per stage and micro-batch;
# no case has as many micro-batches as images per micro-batch, so swapping the two shows
PIPELINE_CASES = (
    ((1.0, 1.0), (2.5, 2.5), 16, 2),            # equal stages, size divides the batch
    ((0.5, 1.5), (1.0, 3.0), 16, 8),            # unequal stages: the slowest sets the pace
    ((0.2, 0.3, 0.1), (0.4, 0.6, 0.2), 12, 2),  # three stages
    ((1.0, 2.0), (2.0, 4.0), 120, 7),           # 7 does not divide 120: 18 micro-batches
    ((1.0, 2.0), (2.0, 4.0), 10, 10),           # one micro-batch: no overlap at all
    ((0.3, 0.1), (0.0, 0.0), 9, 1),             # forward only (inference)
)


def _as_seconds(got) -> float | None:
    try:
        return None if isinstance(got, (bool, str)) else float(got)
    except (TypeError, ValueError):
        return None


def _as_count(got) -> int | None:
    return None if isinstance(got, bool) or not isinstance(got, int) else got


def _gpipe_total(forward_times, backward_times, m: int) -> float:
    return predict(forward_times, backward_times, m).total


def _time_hint(got: float, forward_times, backward_times, batch_size: int, microbatch_size: int) -> str:
    m = num_microbatches(batch_size, microbatch_size)
    suspects = [
        (batch_size // microbatch_size, "the value for batch_size // microbatch_size micro-batches: the "
         "last, smaller micro-batch is one too (round up)"),
        (microbatch_size, "the value for microbatch_size micro-batches: that is a size, the count is "
         "ceil(batch_size / microbatch_size)"),
    ]
    for count, text in suspects:
        if count != m and count >= 1 and math.isclose(got, _gpipe_total(forward_times, backward_times, count)):
            return f" ({text})"
    stages, slowest = len(forward_times), max(forward_times) + max(backward_times or (0,))
    if len(set(forward_times)) > 1 and math.isclose(got, (m + stages - 1) * slowest):
        return (" (that is (m + S - 1) turns of the slowest stage: right for equal stages only; the first "
                "micro-batch passes each stage at that stage's own speed, sum(forward_times) + sum(backward_times))")
    if stages > 1 and math.isclose(got, m * slowest):
        return (" (that is m turns of the slowest stage with no fill: the first micro-batch must first pass every "
                "stage, sum(forward_times), and the backward drains the same way)")
    if math.isclose(got, m * (sum(forward_times) + sum(backward_times))):
        return " (that is the time with no overlap: stage s starts micro-batch i as soon as it has " \
               "finished i - 1 and stage s - 1 has finished i)"
    if any(backward_times) and math.isclose(got, _gpipe_total(forward_times, (), m)):
        return " (that is the forward alone: add the backward, which runs the same way in reverse)"
    return ""


def check_pipeline_time(fn, cases=PIPELINE_CASES) -> CheckReport:
    """Check ``fn(forward_times, backward_times, batch_size, microbatch_size) -> seconds``: the time
    of one GPipe step (all forwards, then all backwards) if only computation cost time, where
    ``forward_times[s]`` and ``backward_times[s]`` are stage ``s``'s time per micro-batch."""
    check_callable(fn, "fn(forward_times, backward_times, batch_size, microbatch_size)")
    report = CheckReport("pipeline time")
    for forward_times, backward_times, batch_size, microbatch_size in cases:
        m = num_microbatches(batch_size, microbatch_size)
        label = (f"forward {list(forward_times)}, backward {list(backward_times)}, batch {batch_size}, "
                 f"micro-batch size {microbatch_size} ({m} micro-batches)")
        report.case(f"{len(forward_times)} stages, batch {batch_size} / size {microbatch_size}")
        want = _gpipe_total(forward_times, backward_times, m)
        args = (list(forward_times), list(backward_times), batch_size, microbatch_size)
        seconds = report.answer(label, fn, args, _as_seconds, f"a number of seconds ({want:g})")
        if seconds is not None and not math.isclose(seconds, want, rel_tol=1e-9, abs_tol=1e-12):
            report.fail(f"{label}: expected {want:g} s, got {seconds:g} s" + _time_hint(
                seconds, forward_times, backward_times, batch_size, microbatch_size))
    return raise_or_report(report)


# -- lesson 8: activations each stage keeps ------------------------------------------------------

HELD_SCHEDULES = ("gpipe", "1f1b")
HELD_SHAPES = ((2, 4), (2, 1), (4, 8), (4, 2), (5, 3), (3, 12))  # (num_stages, num_microbatches)


def microbatches_held_of(schedule: str, num_stages: int, num_microbatches: int) -> list[int]:
    """Per stage, the most micro-batches whose forward ran and whose backward has not, replaying
    the schedule's order of work (``bubble_model.schedule_orders``)."""
    peaks = []
    for order in schedule_orders(schedule, num_stages, num_microbatches):
        live = peak = 0
        for kind, _ in order:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def _held_hint(got: list, want: list, schedule: str, num_stages: int, m: int) -> str:
    if schedule == "1f1b" and got == [num_stages - s for s in range(num_stages)]:
        return " (a stage cannot hold more micro-batches than there are: cap it at num_microbatches)"
    if schedule == "1f1b" and got == [min(m, num_stages - s - 1) for s in range(num_stages)]:
        return " (one too few: stage s (from 0) runs S - s forwards before its first backward)"
    if schedule == "1f1b" and got == list(reversed(want)):
        return " (reversed: the first stage runs the most forwards ahead, the last stage the fewest)"
    if schedule == "1f1b" and num_stages > 1 and got == [m] * num_stages and got != want:
        return (" (that is GPipe's: 1F1B starts each stage's backwards early, so stage s holds at most num_stages - s "
                "micro-batches)")
    if schedule == "gpipe" and got != want:
        return " (GPipe runs every forward before any backward)"
    return ""


def check_microbatches_held(fn, schedules=HELD_SCHEDULES, shapes=HELD_SHAPES) -> CheckReport:
    """Check ``fn(schedule, num_stages, num_microbatches) -> list``: for ``schedule`` "gpipe" or
    "1f1b", one number per stage (stage 0 first): the most micro-batches whose activations that stage
    keeps at once (forward done, backward not yet). Cases are named "schedule stages x micro-batches"."""
    check_callable(fn, "fn(schedule, num_stages, num_microbatches)")
    report = CheckReport("micro-batches held")
    for schedule in schedules:
        for num_stages, m in shapes:
            report.case(f"{schedule} {num_stages}x{m}")
            label = f"{schedule}, {num_stages} stages, {m} micro-batches"
            want = microbatches_held_of(schedule, num_stages, m)
            got = report.answer(label, fn, (schedule, num_stages, m), _as_list,
                                f"one number per stage such as {want}")
            if got is not None and got != want:
                report.fail(f"{label}: expected {want}, got {got}" + _held_hint(got, want, schedule, num_stages, m))
    return raise_or_report(report)


# -- lesson 6: the bottom of the U-curve ---------------------------------------------------------

# (forward, backward, fixed_seconds, overhead_seconds, candidates): stage times alone on the whole
# batch, the rest of a step, the cost of one more micro-batch, the counts to choose from
BEST_COUNT_CASES = (
    ((0.6, 0.8), (1.2, 1.6), 0.10, 0.020, (1, 2, 4, 8, 16, 32)),  # the bottom in the middle
    ((0.6, 0.8), (1.2, 1.6), 0.10, 0.200, (1, 2, 4, 8, 16, 32)),  # dearer micro-batches: fewer
    ((1.0, 1.0), (2.0, 2.0), 0.05, 0.0, (1, 2, 4, 8)),            # no overhead: the most
    ((0.5, 0.5), (1.0, 1.0), 0.0, 1.0, (1, 2, 4)),                # overhead above any gain: 1
    ((0.3, 0.9), (0.6, 1.8), 0.2, 0.01, (1, 2, 3, 4, 6, 12)),     # unbalanced stages
    ((0.2, 0.3, 0.1), (0.4, 0.6, 0.2), 0.05, 0.015, (1, 2, 4, 8, 16)),  # three stages
    ((0.6, 0.8), (1.2, 1.6), 0.10, 0.020, (8, 2, 32, 4)),        # candidates in any order
)


def _best_count_hint(got: int, forward, backward, fixed, overhead, candidates) -> str:
    if got not in candidates:
        return f" (choose one of the candidates {sorted(candidates)})"
    if got == best_count(forward, backward, fixed, 0.0, candidates):
        return (" (that is the best without the overhead: each micro-batch after the first adds "
                "overhead_seconds)")
    whole = min(sorted(candidates), key=lambda m: fixed + sum(forward) + sum(backward)
                + (m - 1) * (max(forward) + max(backward) + overhead))
    if got == whole:
        return (" (the stage times are for the whole batch: with m micro-batches each one takes "
                "forward[s] / m and backward[s] / m)")
    return ""


def check_best_num_microbatches(fn, cases=BEST_COUNT_CASES) -> CheckReport:
    """Check ``fn(forward, backward, fixed_seconds, overhead_seconds, candidates) -> int``: the
    number of micro-batches in ``candidates`` with the shortest training step, where ``forward[s]``
    and ``backward[s]`` are stage ``s``'s times alone on the whole batch, ``fixed_seconds`` the rest
    of a step and ``overhead_seconds`` what each micro-batch after the first adds. The step time for
    ``m`` is the bubble model's GPipe schedule of ``forward[s] / m``, ``backward[s] / m`` plus
    ``fixed_seconds + overhead_seconds * (m - 1)`` (``ppkit.pipeline.rpc.ucurve.step_model``); on a tie,
    the smaller count."""
    check_callable(fn, "fn(forward, backward, fixed_seconds, overhead_seconds, candidates)")
    report = CheckReport("best number of micro-batches")
    for forward, backward, fixed, overhead, candidates in cases:
        label = (f"forward {list(forward)}, backward {list(backward)}, fixed {fixed} s, overhead "
                 f"{overhead * 1e3:g} ms, candidates {list(candidates)}")
        report.case(f"{len(forward)} stages, overhead {overhead * 1e3:g} ms")
        want = best_count(forward, backward, fixed, overhead, candidates)
        case = (forward, backward, fixed, overhead)
        got = report.answer(label, fn, (list(forward), list(backward), fixed, overhead, list(candidates)),
                            _as_count, f"a whole number of micro-batches ({want})")
        if got is not None and got != want:
            report.fail(f"{label}: expected {want} ({step_model(*case, want):.3f} s per step), got {got}"
                        + (f" ({step_model(*case, got):.3f} s)" if got >= 1 else "")
                        + _best_count_hint(got, *case, candidates))
    return raise_or_report(report)
