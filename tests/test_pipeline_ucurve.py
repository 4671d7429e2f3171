"""The U-curve: its arithmetic (reference, bubble bound, overhead fit, best count) on known numbers,
then measured on a small real pipeline, the auto cut, and the speed-up line of ``ppkit pipeline``."""

from __future__ import annotations

import math
import re

import matplotlib
import pytest

import ppkit
from ppkit.cli import main as cli_main
from ppkit.errors import ExerciseFailed
from ppkit.exercises import check_pipeline, solutions
from ppkit.pipeline.bubble import closed_form
from ppkit.pipeline.rpc.balance import CutCandidate, format_candidates, measure_cuts, pick
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.rpc.sweep import build_model
from ppkit.pipeline.rpc.ucurve import (
    CurvePoint,
    Reference,
    UCurve,
    best_count,
    fit_overhead,
    measure_ucurve,
    sizes_for_counts,
    step_model,
)

matplotlib.use("Agg")
# groups: [speed-up over the same micro-batches one at a time, its overlap bound,] speed-up over the
# whole batch in one micro-batch, its bubble bound, the count, the micro-batch size
SPEEDUP_LINE = re.compile(r"^speed-up over no overlap(?: at the same micro-batch size: (\d+\.\d\d)x \(overlap "
                          r"bound (\d+\.\d\d)x\); over the whole batch in one)?: (\d+\.\d\d)x \(bubble bound "
                          r"(\d+\.\d\d)x, (\d+) micro-batches of (\d+)\)$")


def test_reference_bound_is_the_bubble_model_of_the_solo_times_split_m_ways():
    ref = Reference(step_seconds=3.0, forward=(0.4, 0.6), backward=(0.8, 1.0))
    assert ref.fixed_seconds == pytest.approx(0.2)
    assert ref.bound_seconds(1) == pytest.approx(3.0)
    for m in (2, 4, 8):
        ideal = closed_form([0.4 / m, 0.6 / m], [0.8 / m, 1.0 / m], m)
        assert ref.bound_seconds(m) == pytest.approx(0.2 + ideal)
    # equal stages, many micro-batches: the bound tends to the no-overlap time over the stage count
    equal = Reference(2.0, (0.5, 0.5), (0.5, 0.5))
    assert equal.bound_speedup(1000) == pytest.approx(2.0, rel=1e-2)


def test_overhead_fit_recovers_a_known_cost_and_the_best_count():
    ref = Reference(3.0, (0.4, 0.6), (0.8, 1.0))
    counts = [1, 2, 4, 8, 16, 32]
    measured = [ref.bound_seconds(m) + 0.025 * (m - 1) for m in counts]
    assert fit_overhead(counts, measured, [ref.bound_seconds(m) for m in counts]) == pytest.approx(0.025)
    points = [CurvePoint(m, 32 // m, [t]) for m, t in zip(counts, measured, strict=True)]
    curve = UCurve(PipelineConfig(batch_size=32), "layer2", ref, points)
    assert curve.overhead_seconds == pytest.approx(0.025)
    assert curve.best.num_microbatches == curve.predicted_best == 8
    assert curve.model_seconds(8) == pytest.approx(measured[3])
    match = SPEEDUP_LINE.match(curve.summary())
    assert match, curve.summary()
    assert match[1] is None  # no same-size reference measured for these points
    assert float(match[3]) == pytest.approx(3.0 / measured[3], abs=0.005)
    assert float(match[4]) == pytest.approx(ref.bound_speedup(8), abs=0.005)
    assert match.group(5, 6) == ("8", "4")
    assert best_count((0.4, 0.6), (0.8, 1.0), 0.2, 0.025, counts) == 8
    assert step_model((0.4, 0.6), (0.8, 1.0), 0.2, 0.0, 1) == pytest.approx(3.0)
    text = curve.format_table()
    assert text.splitlines()[0].split()[:2] == ["micro-batches", "micro-batch"] and len(text.splitlines()) == 7


def test_counts_become_sizes_and_impossible_counts_are_refused():
    assert sizes_for_counts(32, [8, 2]) == [(1, 32), (2, 16), (8, 4)]  # 1 (the reference) added
    assert sizes_for_counts(10, [3]) == [(1, 10), (3, 4)]
    with pytest.raises(ppkit.ConfigError, match="cannot be cut into 12 micro-batches"):
        sizes_for_counts(32, [12])
    with pytest.raises(ppkit.ConfigError, match="does not fit a batch of 4"):
        sizes_for_counts(4, [8])


def test_balance_picks_the_smallest_slowest_stage():
    candidates = [CutCandidate("layer1", (0.1, 0.5), (0.2, 1.0)), CutCandidate("layer2", (0.3, 0.3), (0.6, 0.7)),
                  CutCandidate("layer3", (0.5, 0.1), (1.1, 0.1))]
    assert pick(candidates).cut == "layer2"
    assert candidates[1].bound_speedup == pytest.approx(1.9 / 1.0)
    table = format_candidates(candidates)
    assert "<- chosen" in next(line for line in table.splitlines() if line.strip().startswith("layer2"))
    with pytest.raises(ppkit.ConfigError):
        pick([])


def test_exercise_checker_accepts_the_solution_and_names_the_mistakes():
    assert check_pipeline.check_best_num_microbatches(solutions.best_num_microbatches).passed
    with pytest.raises(ExerciseFailed, match="best without the overhead"):
        check_pipeline.check_best_num_microbatches(lambda f, b, fixed, o, c: max(c))
    with pytest.raises(ExerciseFailed, match="stage times are for the whole batch"):
        check_pipeline.check_best_num_microbatches(
            lambda f, b, fixed, o, c: min(sorted(c), key=lambda m: sum(f) + sum(b) + (m - 1) * (max(f) + max(b) + o)))
    with pytest.raises(ExerciseFailed, match="NotImplementedError"):
        def stub(*args):
            raise NotImplementedError
        check_pipeline.check_best_num_microbatches(stub)
    with pytest.raises(ExerciseFailed, match="whole number"):
        check_pipeline.check_best_num_microbatches(lambda *args: 8.0)


@pytest.fixture(scope="module")
def world():
    with ppkit.start_rpc(num_workers=2) as world:
        yield world


def test_measured_ucurve_and_auto_cut_on_real_workers(world):
    config = PipelineConfig(batch_size=4, image_size=40, num_batches=2, microbatch_sizes=(4,),
                            placement="worker1:cpu,worker2:cpu", cut="layer1").check()
    model, optimizer = build_model(config)
    steps = []
    try:
        curve = measure_ucurve(model, optimizer, config, counts=[2, 4],
                               progress=lambda done, total: steps.append((done, total)))
    finally:
        model.close()
    assert steps[-1] == (13, 13)  # 3 counts x (1 warm-up + 2 rounds), and 2 rounds of 2 same-size references
    assert curve.counts == [1, 2, 4] and [p.microbatch_size for p in curve.points] == [4, 2, 1]
    assert all(len(p.step_seconds) == 2 and len(p.no_overlap_seconds) == 2 for p in curve.points)
    one, *more = curve.points
    assert one.no_overlap_seconds == one.step_seconds and one.overlap_speedup == 1.0 == curve.overlap_bound(one)
    for point in more:  # the same micro-batches, one at a time: every one of them, on both stages
        assert point.no_overlap_run.microbatch_size == point.microbatch_size
        assert sorted(e.microbatch for e in point.no_overlap_run.timeline.select(1, "forward")) == list(
            range(point.num_microbatches))
        assert point.overlap_speedup == pytest.approx(point.no_overlap / point.seconds)
        assert curve.overlap_bound(point) == pytest.approx(point.no_overlap_run.seconds_per_batch / (
            curve.reference.fixed_seconds + point.no_overlap_run.prediction.total))
    ref = curve.reference
    assert ref.step_seconds == curve.points[0].seconds
    assert all(f > 0 for f in ref.forward) and all(b > 0 for b in ref.backward)
    assert ref.bound_seconds(1) == pytest.approx(ref.step_seconds)  # the same step: no gap
    assert ref.bound_seconds(4) < ref.bound_seconds(1)  # the bubble shrinks
    assert math.isfinite(curve.overhead_seconds)
    assert {p.process for p in curve.resources} >= {"worker1", "worker2"}
    match = SPEEDUP_LINE.match(curve.summary())
    assert match and float(match[1]) == pytest.approx(curve.best.overlap_speedup, abs=0.005)
    assert "no overlap s (same size)" in curve.format_table()
    for point in curve.points:  # the timeline kept is the last round's, at that count
        assert point.run.num_microbatches == point.num_microbatches
    from ppkit.pipeline.plots import ucurve_figure

    assert len(ucurve_figure(curve).subfigs) == 2

    candidates = measure_cuts(config.replace(num_batches=1), cuts=("stem", "layer3"), rounds=1)
    assert [c.cut for c in candidates] == ["stem", "layer3"]
    assert all(len(c.stage_seconds) == 2 and min(c.stage_seconds) > 0 for c in candidates)


def test_widget_ucurve_auto_cut_and_resources(world):
    from ppkit.widgets.pipeline import PipelineWidget

    ui = PipelineWidget(world, batch_size=2, image_size=48, num_batches=1, microbatch_size=1)
    assert "auto" in ui.cut.options and ui.stage_threads.value == "auto"
    assert "ppkit-pipeline-ucurve" in ui.ucurve_button._dom_classes
    ui.cut.value = "auto"
    ui.ucurve_button.click()
    assert ui.status.value.count("speed-up over no overlap") == 1, ui.status.value
    assert "&lt;- chosen" in ui.cuts_table.value
    assert "stage 1 on worker1: 1 thread" in ui.resources.value
    assert ui.curve.counts == [1, 2] and ui.curve.cut in ("stem", "layer1", "layer2", "layer3")
    panel = ui.ucurve_panel  # a component of the widget, with its own table and plots
    assert panel.table.value.count("<tr>") == 3 and "bubble bound s" in panel.table.value
    assert bytes(panel.plot.value[:4]) == b"\x89PNG" and bytes(panel.timeline.value[:4]) == b"\x89PNG"
    assert panel in ui.children and panel.plot.layout.display is None
    ui.stage_threads.value = "off"  # another model: nothing pinned, and the widget says so
    ui.run()
    assert "unchanged" in ui.resources.value
    assert ui.curve is panel.curve is not None and "<tr>" in ui.table.value  # the run's results beside it
    ui.clear()
    assert ui.curve is None and panel.table.value == "" and panel.plot.layout.display == "none"
    ui.close_model()


def test_cli_prints_resources_the_ucurve_and_one_speedup_line(world, tmp_path, capsys):
    # last in this module: the command starts its own world, which closes the fixture's
    plot = tmp_path / "u.png"
    status = cli_main(["pipeline", "--batch-size", "4", "--image-size", "40", "--num-batches", "1",
                       "--num-microbatches", "2", "4", "--cut", "auto", "--plot", str(plot)])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("ResNet50 cut after auto (measured below), placement worker1:cpu,worker2:cpu")
    assert "<- chosen" in out and "stage 1 on worker1: 1 thread" in out
    assert "per-micro-batch overhead:" in out and "each stage alone on the whole batch" in out
    table = lines[lines.index(next(line for line in lines if line.startswith("micro-batches"))):]
    assert [row.split()[:2] for row in table[1:4]] == [["1", "4"], ["2", "2"], ["4", "1"]]
    speedups = [line for line in lines if line.startswith("speed-up over no overlap")]
    assert len(speedups) == 1 and SPEEDUP_LINE.match(speedups[0]) and lines[-1] == speedups[0]
    assert plot.read_bytes().startswith(b"\x89PNG")
