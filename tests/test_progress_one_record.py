"""One record, one meaning (issue 46, item 12): a learner's checks live in one store, ``ppkit progress``, ``ppkit
exercises`` and the instructor's room read the same outcome from it, ``ppkit progress --off`` stops all of it, and
the course's exercise list is plain data that both the catalog and the room read."""

from __future__ import annotations

import ast
import json
import time

import pytest

from ppkit.cli import main as ppkit_cli
from ppkit.errors import ExerciseFailed
from ppkit.exercises import catalog, course, solutions, workbook
from ppkit.progress import format as fmt
from ppkit.progress import read
from ppkit.room.progress_fetch import Fetched
from ppkit.room.progress_rows import row_of

NB = "notebooks/06_pipeline.ipynb"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A learner's home with nothing configured: the record goes where ppkit puts it by default."""
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (fmt.DIR_ENV, fmt.SWITCH_ENV, "PPKIT_PROGRESS", "JPY_SESSION_NAME", "JPY_PARENT_PID"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def wrong_pipeline_time(forward_times, backward_times, batch_size, microbatch_size):
    return 0.0


def test_a_pass_then_a_failure_is_passed_in_every_view_with_the_failure_shown_as_later(home, monkeypatch, capsys):
    monkeypatch.setenv("JPY_SESSION_NAME", str(home / NB))
    workbook.check("pipeline_time", solutions.pipeline_time)
    with pytest.raises(ExerciseFailed) as failed:
        workbook.check("pipeline_time", wrong_pipeline_time)
    capsys.readouterr()
    reason = fmt.first_line(failed.value)

    assert ppkit_cli(["progress", "--json"]) == 0
    [book] = json.loads(capsys.readouterr().out)["notebooks"]
    [state] = book["exercises"]
    assert (state["status"], state["reason"]) == ("passed", reason), state
    assert state["failed_t"] > state["passed_t"]  # the failure came after the pass, and is shown as such

    assert ppkit_cli(["progress"]) == 0
    table = capsys.readouterr().out
    assert "  passed      pipeline_time\n" in table
    assert "  failed      " not in table  # a pass then a fail is not "failed"
    [since] = [line for line in table.splitlines() if line.startswith("  failed since passed  pipeline_time (")]
    assert since.endswith(f"): {reason}"), table

    assert {r["name"]: r["status"] for r in workbook.progress_rows()}["pipeline_time"] == workbook.PASSED

    record = home / "ppkit-progress"
    texts = {name: (record / name).read_text() if (record / name).exists() else None
             for name in (fmt.OLD, fmt.CURRENT)}
    row = row_of(Fetched("ana", "running", texts=texts, sessions=[{"path": NB, "kernel": {"execution_state": "idle"}}],
                         now=time.time()))
    assert row.exercises[NB]["passed"] == ["pipeline_time"] and row.exercises[NB]["failed"] == []
    [attempts] = row.attempts
    assert (attempts.status, attempts.last_failure) == ("passed", reason)


def test_off_stops_every_record_and_nothing_else_is_written(home, capsys):
    assert ppkit_cli(["progress", "--off"]) == 0
    workbook.check("my_share", solutions.my_share)
    with pytest.raises(ExerciseFailed):
        workbook.check("pipeline_time", wrong_pipeline_time)
    capsys.readouterr()
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert written == ["ppkit-progress/OFF"]  # no second store (~/.ppkit/progress.json) took the checks
    assert all(r["status"] == workbook.NOT_TRIED for r in workbook.progress_rows())


def test_ppkit_exercises_reads_the_one_record(home, capsys):
    workbook.check("my_share", solutions.my_share)
    with pytest.raises(ExerciseFailed):
        workbook.check("pipeline_time", wrong_pipeline_time)
    capsys.readouterr()
    checks = [e for e in read.read_folder(home / "ppkit-progress").events if e.kind == "check"]
    assert [(e.fields["exercise"], e.fields["status"]) for e in checks] == [("my_share", "passed"),
                                                                           ("pipeline_time", "failed")]
    assert ppkit_cli(["exercises"]) == 0
    out = capsys.readouterr().out.splitlines()
    status = {line.split()[1]: line.split()[2] for line in out[:-1]}
    assert (status["my_share"], status["pipeline_time"], status["ring_shift"]) == ("passed", "failed", "not")
    assert out[-1] == (f"1 of {len(catalog.EXERCISES)} exercises passed on this machine "
                       f"({home / 'ppkit-progress'})")


def test_an_unreadable_record_is_said_and_shows_nothing_tried(home, capsys):
    folder = home / "ppkit-progress"
    folder.mkdir()
    (folder / fmt.CURRENT).write_text("{not json\n")
    assert all(r["status"] == workbook.NOT_TRIED for r in workbook.progress_rows())
    assert "1 line(s) not JSON" in capsys.readouterr().err


def test_the_course_is_plain_data_that_the_catalog_and_the_room_both_read():
    source = ast.parse(open(course.__file__, encoding="utf-8").read())
    assert not [n for n in ast.walk(source) if isinstance(n, (ast.Import, ast.ImportFrom, ast.Call))], (
        "ppkit/exercises/course.py must stay plain data: the room reads it without importing torch or a checker")
    assert [(e.name, e.notebook, e.signature, e.hints) for e in catalog.EXERCISES] == [
        (e["name"], e["notebook"], e["signature"], tuple(e["hints"])) for e in course.EXERCISES]
    from ppkit.room.progress_rows import per_notebook

    listed = per_notebook([], ["notebooks/06_pipeline.ipynb"])["notebooks/06_pipeline.ipynb"]["not_tried"]
    assert listed == [e["name"] for e in course.EXERCISES if e["notebook"] == "06_pipeline"]
    assert len(listed) == 2


def test_a_course_entry_without_code_is_named(monkeypatch):
    from ppkit.errors import ConfigError

    extra = {"name": "ring_gather", "notebook": "02_collectives", "signature": "ring_gather(rank)", "hints": ()}
    monkeypatch.setattr(course, "EXERCISES", (*course.EXERCISES, extra))
    with pytest.raises(ConfigError, match=r"do not name the same exercises: \['ring_gather'\]"):
        catalog._exercises()  # what importing the catalog runs


def test_a_failure_then_not_written_is_not_written_in_ppkit_progress_and_the_room_alike(home):
    """She failed, then emptied her function (a check that says "not written"): every view says "not written", and
    the room does not call her stuck on a failure she has set aside."""
    t0 = time.time() - 3600
    record = home / "ppkit-progress"
    record.mkdir()
    lines = [{"v": 1, "t": t0, "kind": "check", "notebook": str(home / NB), "pid": 7, "exercise": "pipeline_time",
              "status": "failed", "reason": "case 2: expected 7.0, got 6.0"},
             {"v": 1, "t": t0 + 60, "kind": "check", "notebook": str(home / NB), "pid": 7,
              "exercise": "pipeline_time", "status": "not written"}]
    (record / fmt.CURRENT).write_text("".join(json.dumps(line) + "\n" for line in lines))
    [book] = read.read_folder(record).notebooks
    [state] = book.exercises
    row = row_of(Fetched("ana", "running", texts={fmt.CURRENT: (record / fmt.CURRENT).read_text(), fmt.OLD: None},
                         sessions=[{"path": NB, "kernel": {"execution_state": "idle"}}], now=time.time()),
                 stuck_after=5)
    [attempts] = row.attempts
    assert state.status == attempts.status == "not written"
    assert (attempts.attempts, attempts.failures, attempts.last_failure) == (1, 1, "case 2: expected 7.0, got 6.0")
    assert row.stuck == [] and row.state == "ok", row.stuck
