"""``ppkit pipeline --schedule gpipe|1f1b``: the tutorial's experiment with torch.distributed.pipelining."""

from __future__ import annotations

import matplotlib
import pytest

import ppkit
from ppkit.cli import main as cli_main
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.schedules import sweep

matplotlib.use("Agg")


@pytest.mark.parametrize("flags, message", [
    (["--schedule", "gpipe", "--batch-size", "4", "--microbatch-sizes", "3"], "does not divide the batch"),
    (["--schedule", "1f1b", "--batch-size", "4", "--microbatch-sizes", "4"], "1F1B needs at least one"),
])
def test_flags_a_schedule_cannot_run_are_refused_before_anything_starts(flags, message, capsys, no_leftovers):
    assert cli_main(["pipeline", *flags]) == 2
    assert message in capsys.readouterr().err


def test_check_config():
    with pytest.raises(ppkit.ConfigError, match="1000 classes"):
        sweep.check_config(PipelineConfig(batch_size=4, image_size=40, microbatch_sizes=(2,),
                                          num_classes=10), "gpipe")
    with pytest.raises(ppkit.ConfigError, match="unknown schedule"):
        sweep.check_config(PipelineConfig(batch_size=4, image_size=40, microbatch_sizes=(2,)), "zb")


@pytest.mark.slow
def test_cli_end_to_end_with_1f1b(tmp_path, capsys, no_leftovers):
    # the tutorial's training (MSE on one-hot labels, train-mode BN, SGD); --verify then checks the
    # MSE gradients against a local ResNet50
    plot = tmp_path / "sweep.png"
    status = cli_main(["pipeline", "--schedule", "1f1b", "--batch-size", "4", "--image-size", "40",
                       "--num-batches", "2", "--microbatch-sizes", "2", "--cut", "layer1",
                       "--plot", str(plot), "--verify"])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("ResNet50 cut after layer1, 1f1b schedule of torch.distributed.pipelining")
    assert "micro-batch size" in lines[1]
    assert lines[2].split()[:2] == ["2", "2"]  # micro-batch size 2, so 2 micro-batches
    assert float(lines[2].split()[2]) > 0  # seconds per batch
    assert plot.read_bytes().startswith(b"\x89PNG")
    verify = next(line for line in lines if line.startswith("verify:"))
    assert "OK" in verify and float(verify.split("= ")[1].split()[0]) <= sweep.VERIFY_TOLERANCE
