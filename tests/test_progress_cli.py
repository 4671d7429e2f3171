"""``ppkit progress``: the learner's own table and ``--json`` from a record written by ppkit's own hooks,
``--off`` / ``--on``, and what it says about garbage in the files. PPKIT_RECORD_DIR: a tmp folder."""

from __future__ import annotations

import json
import stat
import subprocess
import sys

import pytest

from ppkit.checklist import Check
from ppkit.cli import main as ppkit_cli
from ppkit.errors import ExerciseFailed
from ppkit.progress import format as fmt
from ppkit.progress import hooks


@pytest.fixture
def folder(tmp_path, monkeypatch):
    path = tmp_path / "ppkit-progress"
    monkeypatch.setenv(fmt.DIR_ENV, str(path))
    monkeypatch.delenv(fmt.SWITCH_ENV, raising=False)
    return path


@pytest.fixture
def recorded(folder, monkeypatch):
    """A record with a bit of everything, in notebook 06_pipeline, and a preflight from a terminal."""
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/06_pipeline.ipynb")
    hooks.checked("pipeline_time", "failed", ExerciseFailed("for 4 stages and 8 micro-batches you gave 11, "
                                                            "expected 33\nsecond line"))
    hooks.checked("pipeline_time", "passed")
    hooks.checked("best_num_microbatches", "failed", ExerciseFailed("with 2 stages, 1 is too few"))
    hooks.job_started("ppkit.spawn", 2)
    hooks.job_ended("ppkit.spawn", 2, None)
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/00_start_here.ipynb")
    hooks.checked("my_share", "not written yet")
    monkeypatch.delenv("JPY_SESSION_NAME")
    hooks.preflight_done([Check("python", "ok", "3.11"), Check("machine", "warn", "2 cores")], "preflight: 2/2 ok")
    return folder


def progress(capsys, *flags) -> tuple[int, str]:
    code = ppkit_cli(["progress", *flags])
    return code, capsys.readouterr().out


def test_the_table_shows_each_notebook_its_exercises_and_where_the_files_are(recorded, capsys):
    code, out = progress(capsys)
    assert code == 0
    assert f"Your progress record: {recorded} (record.jsonl, record.old.jsonl; 7 line(s) read)." in out
    assert "ppkit sends nothing anywhere" in out and "ppkit progress --off" in out
    pipeline = out.split("notebooks/06_pipeline.ipynb", 1)[1].split("\n\n")[0]
    lines = [line.strip() for line in pipeline.splitlines()[1:]]
    assert lines[0] == "passed      pipeline_time"
    assert lines[1].startswith("failed      best_num_microbatches (") and lines[1].endswith("): with 2 stages, 1 "
                                                                                         "is too few")
    assert lines[2].startswith("cluster     finished (") and "ppkit.spawn: all 2 rank(s) finished" in lines[2]
    start = out.split("notebooks/00_start_here.ipynb", 1)[1].split("\n\n")[0]
    assert "not written my_share" in start
    assert "preflight     warnings (" in out and out.rstrip().endswith("preflight: 2/2 ok")


def test_json_says_the_same_with_the_exercises_not_tried(recorded, capsys):
    code, out = progress(capsys, "--json")
    body = json.loads(out)
    assert code == 0 and body["folder"] == str(recorded) and body["recording"] and body["sent_anywhere"] is False
    pipeline = body["notebooks"][0]
    assert pipeline["notebook"] == "notebooks/06_pipeline.ipynb" and pipeline["not_tried"] == []
    states = {e["exercise"]: e for e in pipeline["exercises"]}
    assert states["pipeline_time"]["status"] == "passed" and states["pipeline_time"]["failures"] == 1
    assert states["pipeline_time"]["reason"] == "for 4 stages and 8 micro-batches you gave 11, expected 33"
    assert pipeline["last_cluster"]["state"] == "finished"
    assert body["preflight"]["verdict"] == "warnings" and body["problems"] == []
    assert "events" not in body


def test_off_and_on_switch_the_record(folder, capsys):
    code, out = progress(capsys, "--off")
    assert code == 0 and "Progress recording is off" in out
    assert "workbook.progress(), `ppkit exercises` and the instructor's room do not see them" in out  # what it costs
    assert stat.S_IMODE((folder / fmt.OFF).stat().st_mode) == 0o600
    hooks.checked("ring_shift", "passed")
    assert not (folder / fmt.CURRENT).exists()
    assert "Recording is OFF: the file" in progress(capsys)[1]
    assert json.loads(progress(capsys, "--json")[1])["recording"] is False
    assert "Progress recording is on" in progress(capsys, "--on")[1]
    hooks.checked("ring_shift", "passed")
    assert (folder / fmt.CURRENT).read_text().count("\n") == 1


def test_on_says_when_the_environment_still_switches_it_off(folder, monkeypatch, capsys):
    monkeypatch.setenv(fmt.SWITCH_ENV, "off")
    assert "PPKIT_RECORD=off in the environment still stops it" in progress(capsys, "--on")[1]
    assert "Recording is OFF: PPKIT_RECORD=off" in progress(capsys)[1]


def test_an_empty_record_and_a_spoilt_one_are_said_so(folder, capsys):
    assert "Nothing recorded yet" in progress(capsys)[1]
    folder.mkdir()
    (folder / fmt.CURRENT).write_bytes(b"\x00\x01 not json\n[1]\n")
    out = progress(capsys)[1]
    assert "Not read: 1 line(s) not JSON; 1 line(s) not a JSON object." in out
    assert json.loads(progress(capsys, "--json")[1])["bad_lines"] == {"not JSON": 1, "not a JSON object": 1}


def test_the_command_runs_as_the_learner_types_it(recorded):
    done = subprocess.run([sys.executable, "-m", "ppkit", "progress", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert [b["notebook"] for b in json.loads(done.stdout)["notebooks"]] == [
        "notebooks/06_pipeline.ipynb", "notebooks/00_start_here.ipynb"]
