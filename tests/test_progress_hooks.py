"""What records, outside a kernel: a workbook check, the hang
watch's "hung" with how long and where, a preflight's verdict, how a failed job is named. The kernel's
side (a cell's ppkit error, a ppkit.spawn rank exiting 7) is in test_progress_kernel.py."""

from __future__ import annotations

import time

import pytest

from ppkit.checklist import Check
from ppkit.cluster import hang_watch
from ppkit.cluster.hang_watch import HangWatch
from ppkit.errors import ExerciseFailed, JobInterrupted, ProcessExitedError
from ppkit.exercises import solutions, workbook
from ppkit.preflight import Preflight
from ppkit.progress import format as fmt
from ppkit.progress import hooks, read


@pytest.fixture
def folder(tmp_path, monkeypatch):
    path = tmp_path / "ppkit-progress"
    monkeypatch.setenv(fmt.DIR_ENV, str(path))
    monkeypatch.delenv(fmt.SWITCH_ENV, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return path


def events(kind: str) -> list:
    return [e for e in read.read_folder().events if e.kind == kind]


def test_a_workbook_check_records_each_outcome(folder):
    def my_share(rank, world_size, num_items):
        raise NotImplementedError

    def gives_everything_to_rank_0(rank, world_size, num_items):
        return list(range(num_items)) if rank == 0 else []

    workbook.check("my_share", my_share)
    with pytest.raises(ExerciseFailed) as failed:
        workbook.check("my_share", gives_everything_to_rank_0)
    workbook.check("my_share", solutions.my_share)
    checks = [(e.fields["status"], e.fields.get("reason")) for e in events("check")]
    header, first_problem = str(failed.value).splitlines()[:2]  # "my share: 12 problem(s) in 5 cases:", "  - ..."
    assert checks == [("not written", None), ("failed", f"{header} {first_problem.strip()}"), ("passed", None)]
    assert {row["name"]: row["status"] for row in workbook.progress_rows()}["my_share"] == workbook.PASSED


def stack(*frames: tuple[str, str]) -> str:
    return "Traceback (most recent call last):\n" + "".join(
        f'  File "{path}", line 1, in {func}\n    pass\n' for path, func in frames)


def test_the_hang_watch_records_hung_with_how_long_and_where(folder, monkeypatch):
    start = time.monotonic()
    clock = {"now": start}
    monkeypatch.setattr(hang_watch.time, "monotonic", lambda: clock["now"])  # the watch's clock, moved by hand
    busy = {0: stack(("/work/train.py", "step")), 1: stack(("/t/torch/distributed/c10d.py", "recv"))}
    waiting = {0: stack(("/work/train.py", "step"), ("/t/torch/distributed/c10d.py", "all_reduce")),
               1: stack(("/t/torch/distributed/c10d.py", "recv"))}
    watch = HangWatch(60.0)
    assert watch.due(start + 5.0) == start + 65.0  # the run's last output came 5 s after its start
    clock["now"] = start + 65.0
    assert watch.look(busy) is None and events("cluster") == []  # rank 0 computes: not a hang
    assert watch.due(start + 5.0) == start + 125.0  # look again a minute after that look
    clock["now"] = start + 125.0
    assert watch.look(waiting) is None and events("cluster") == []  # every rank waits: a second look confirms
    assert watch.due(start + 5.0) == start + 125.0 + hang_watch.CONFIRM_S
    clock["now"] = start + 125.0 + hang_watch.CONFIRM_S
    assert watch.look(waiting).startswith("[ppkit] possibly hung")
    [hung] = events("cluster")
    assert hung.fields == {"state": "hung", "seconds": 60.0 + hang_watch.CONFIRM_S,  # since the look that found
                           # rank 0 busy, not since the first look that found every rank waiting
                           "detail": "every rank waits on its peers (stack or flight record): rank 0 in all_reduce, "
                           "rank 1 in recv"}


@pytest.mark.parametrize("statuses, verdict", [(("ok", "ok"), "ready"), (("ok", "warn"), "warnings"),
                                               (("warn", "FAIL"), "not ready"), (("ok", "skip"), "not ready")])
def test_preflight_records_its_verdict(folder, statuses, verdict):
    checks = Preflight(emit=lambda line: None)
    steps = [name for name, member in vars(Preflight).items()  # python, torch, ..., pipeline
             if callable(member) and not name.startswith("_") and name not in ("run", "summary")]
    assert len(steps) >= 10
    for i, name in enumerate(steps):  # no real check: each step says what the test wants
        status = statuses[1] if i == len(steps) - 1 else statuses[0]
        step = (lambda n, s: lambda: Check(n, s, "as the test says"))(name.replace("_", " "), status)
        step.__name__ = name
        setattr(checks, name, step)
    checks.run()
    [pre] = events("preflight")
    assert pre.fields == {"verdict": verdict, "summary": checks.summary()}


@pytest.mark.parametrize("error, detail", [
    (None, None),
    (ProcessExitedError("…", 1, 4242, exit_code=7), "ppkit.spawn: rank 1 exited with code 7"),
    (ProcessExitedError("…", 0, 4242, signal_name="SIGKILL"), "ppkit.spawn: rank 0 was killed by signal SIGKILL"),
])
def test_a_job_end_names_the_rank_and_how(folder, error, detail):
    hooks.job_ended("ppkit.spawn", 2, error)
    [ended] = events("cluster")
    if error is None:
        assert ended.fields == {"state": "finished", "detail": "ppkit.spawn: all 2 rank(s) finished"}
    else:
        assert ended.fields == {"state": "died", "detail": detail}


@pytest.mark.parametrize("error", [JobInterrupted("interrupted"), KeyboardInterrupt()])
def test_a_job_the_learner_stopped_herself_is_stopped_not_died(folder, error):
    hooks.job_ended("%%torchrun", 2, error)
    [ended] = events("cluster")
    assert ended.fields == {"state": "stopped", "detail": "%%torchrun: stopped by Kernel > Interrupt"}


def test_an_exercise_failed_raised_outside_a_check_is_recorded_once_as_an_error(folder):
    """A failed workbook.check is recorded as the failed check only; an ExerciseFailed a learner's own code (or a
    lesson's checker called directly) raises in a cell is a ppkit error like any other, recorded as such."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        hooks.register(shell)
        shell.run_cell("from ppkit.errors import ExerciseFailed\nraise ExerciseFailed('my own check: wrong total')")
        shell.run_cell("from ppkit.exercises import workbook\n"
                       "def gives_everything_to_rank_0(rank, world_size, num_items):\n"
                       "    return list(range(num_items)) if rank == 0 else []\n"
                       "workbook.check('my_share', gives_everything_to_rank_0)")
    finally:
        InteractiveShell.clear_instance()
    assert [(e.fields["error"], e.fields["message"]) for e in events("error")] == [
        ("ExerciseFailed", "my own check: wrong total")]
    assert [e.fields["status"] for e in events("check")] == ["failed"]
