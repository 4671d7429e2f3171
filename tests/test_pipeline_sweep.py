"""The experiment around the pipeline: sweeps, the bubble model on measured timelines, plots, the
notebook widget driven from Python, and ``ppkit pipeline`` end to end."""

from __future__ import annotations

import re

import matplotlib
import pytest

import ppkit
from ppkit.cli import main as cli_main
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.rpc.sweep import run_sweep

matplotlib.use("Agg")

SMALL = dict(batch_size=4, image_size=40, num_batches=1)  # 40x40: train-mode BN works at size 1


@pytest.fixture(scope="module")
def world():
    with ppkit.start_rpc(num_workers=2) as world:
        yield world


@pytest.mark.slow
def test_sweep_rows_timelines_and_bubble_model(world):
    config = PipelineConfig(**SMALL, microbatch_sizes=(1, 3, 4), placement="worker1:cpu,worker2:cpu")
    progress, finished = [], []
    result = run_sweep(config, progress=lambda done, total: progress.append((done, total)),
                       on_result=finished.append)
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert [run.microbatch_size for run in finished] == [1, 3, 4]
    rows = result.rows()
    assert [(r["microbatch_size"], r["num_microbatches"]) for r in rows] == [(1, 4), (3, 2), (4, 1)]
    for run in result.runs:
        timeline = run.timeline
        m = run.num_microbatches
        for stage in (0, 1):
            for phase in ("forward", "backward"):
                assert sorted(e.microbatch for e in timeline.select(stage, phase)) == list(range(m))
        # stage 2 cannot start a micro-batch before stage 1 has finished it
        for mb in range(m):
            first = next(e for e in timeline.select(0, "forward") if e.microbatch == mb)
            second = next(e for e in timeline.select(1, "forward") if e.microbatch == mb)
            assert first.end <= second.start
        # the ideal schedule cannot beat the measured stage work it is built from
        prediction = run.prediction
        assert prediction.num_microbatches == m
        assert prediction.total >= max(timeline.busy(s, "forward") + timeline.busy(s, "backward")
                                       for s in (0, 1)) - 1e-9
        assert run.model_ratio > 0.5
        assert run.seconds_per_batch >= timeline.span() > 0
    text = result.format_table()
    assert "micro-batches" in text and len(text.splitlines()) == 4
    assert result.format_table(markdown=True).startswith("| micro-batch size |")

    from ppkit.pipeline.plots import sweep_figure

    figure = sweep_figure(result, run_index=None)
    assert len(figure.subfigs) == 4  # the sweep, then measured | model for each run


@pytest.mark.slow
def test_widget_driven_from_python(world):
    from ppkit.widgets.pipeline import PipelineWidget

    ui = PipelineWidget(world, batch_size=4, image_size=32, num_batches=1, microbatch_size=1)
    assert "ppkit-pipeline-microbatch" in ui.microbatch_size._dom_classes
    assert "ppkit-pipeline-run" in ui.run_button._dom_classes
    assert "ppkit-pipeline-table" in ui.table._dom_classes
    assert [p.value for p in ui.processes] == ["worker1", "worker2"]
    assert list(ui.processes[0].options) == ["master", "worker1", "worker2"]
    assert ui.device_choices[0].options[0] == "cpu"
    assert ui.num_microbatches.value.startswith("= 4 micro-batches")
    ui.microbatch_size.value = 3
    assert ui.num_microbatches.value.startswith("= 2 micro-batches")
    ui.batch_size.value = 2  # the slider follows the batch size
    assert ui.microbatch_size.max == 2 and ui.microbatch_size.value == 2
    ui.batch_size.value = 4
    ui.microbatch_size.value = 1

    # an empty Image would show a broken-image icon: plots stay hidden until they have a picture
    assert ui.sweep_plot.layout.display == ui.timeline_plot.layout.display == "none"
    ui.run_button.click()  # 32x32 at micro-batch size 1: refused before anything runs
    assert "ConfigError" in ui.status.value and "1x1" in ui.status.value
    assert ui.runs == [] and ui.table.value == ""

    ui.image_size.value = 48
    ui.processes[0].value = "master"
    ui.run_button.click()
    assert "done" in ui.status.value, ui.status.value
    assert [run.microbatch_size for run in ui.runs] == [1]
    assert ui.progress.value == ui.progress.max == 1
    assert ui.table.value.count("<tr>") == 2 and re.search(r"<td[^>]*>4</td>", ui.table.value)
    assert bytes(ui.sweep_plot.value[:4]) == bytes(ui.timeline_plot.value[:4]) == b"\x89PNG"
    assert ui.sweep_plot.layout.display is None and ui.timeline_plot.layout.display is None

    ui.sweep_sizes.value = "0 2"
    ui.sweep_button.click()
    assert "micro-batch size 0 does not fit" in ui.status.value
    ui.sweep_sizes.value = "2, 4"
    runs = ui.sweep()
    assert [run.microbatch_size for run in runs] == [2, 4]
    assert [run.microbatch_size for run in ui.runs] == [1, 2, 4]
    assert len(ui.rows()) == 3 and "micro-batches" in ui.text_table()

    ui.cut.value = "layer3"  # another model: earlier results no longer compare
    ui.run()
    assert [run.microbatch_size for run in ui.runs] == [1]
    ui.clear()
    assert ui.runs == [] and ui.table.value == "" and ui.sweep_plot.layout.display == "none"
    ui.close_model()


@pytest.mark.slow
def test_widget_starts_a_new_world_when_a_later_cell_closed_it(no_leftovers):
    import ppkit
    from ppkit.widgets.pipeline import PipelineWidget

    first = ppkit.start_rpc(2)
    ui = PipelineWidget(first, batch_size=2, image_size=48, num_batches=1, microbatch_size=1)
    first.close()  # what "Run All" does: the notebook's last cell closes the world
    try:
        ui.run_button.click()
        assert "done" in ui.status.value, ui.status.value
        assert ui.world is not first and ui.world.state == "ready"
    finally:
        ui.close_model()
        ui.world.close()


@pytest.mark.slow
def test_cli_end_to_end(world, tmp_path, capsys):
    plot = tmp_path / "sweep.png"
    status = cli_main(["pipeline", "--batch-size", "4", "--image-size", "40", "--num-batches", "1",
                       "--microbatch-sizes", "1", "4", "--placement", "master:cpu,worker1:cpu",
                       "--cut", "layer1", "--plot", str(plot), "--verify"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("ResNet50 cut after layer1, placement master:cpu,worker1:cpu")
    assert lines[1].startswith("stage resources: stage 1 on master: ")
    assert "micro-batch size" in lines[2]
    # sizes 1 and 4 of a batch of 4: 4 micro-batches and 1 (the reference), rows by count
    assert lines[3].split()[:2] == ["1", "4"] and lines[4].split()[:2] == ["4", "1"]
    assert f"plots saved to {plot}" in out
    assert plot.read_bytes().startswith(b"\x89PNG")
    verify = next(line for line in lines if line.startswith("verify:"))
    assert "OK" in verify and float(verify.split("= ")[1].split()[0]) <= 1e-4
    assert lines[-1].startswith("speed-up over no overlap at the same micro-batch size: ")


def test_cli_progress_bar():
    import io

    from ppkit.cli.pipeline import Progress

    stream = io.StringIO()
    bar = Progress(stream, width=10, enabled=True)
    bar(3, 12)
    assert stream.getvalue() == "\r[##........] 3/12 batches"
    bar.clear()
    assert stream.getvalue().endswith("\r") and bar.shown is False
    quiet = Progress(io.StringIO())  # not a terminal: nothing drawn
    quiet(1, 2)
    assert quiet.stream.getvalue() == ""
