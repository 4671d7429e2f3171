"""The learner's side of the exercises: stubs, checks, hints, solutions, progress, and bad input.

Every registered checker runs here against its registered solution; nbval runs the notebooks with those
solutions in their exercise cells (tests/solved_notebooks.py).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import cloudpickle
import nbformat
import pytest
import torch.distributed as dist

import ppkit
from ppkit.cli import main as cli
from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import catalog, check_launch, solutions, workbook
from ppkit.progress import format as progress_format

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PURE = ("my_share", "activation_shape", "pipeline_time", "slurm_to_torchrun", "microbatches_held")


@pytest.fixture(autouse=True)
def record(tmp_path, monkeypatch):
    """Each test keeps its progress record in its own folder, and starts with no hints given."""
    path = tmp_path / "ppkit-progress"
    monkeypatch.setenv(progress_format.DIR_ENV, str(path))
    monkeypatch.delenv(progress_format.SWITCH_ENV, raising=False)
    monkeypatch.setattr(workbook, "_hints_given", {})
    return path


def recorded(path: Path) -> dict:
    """What the progress record in `path` (the test's own) says of each exercise checked."""
    assert progress_format.record_dir() == path
    return {r["name"]: r["status"] for r in workbook.progress_rows() if r["status"] != workbook.NOT_TRIED}


# -- every checker against every solution ---------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", [e.name for e in catalog.EXERCISES])
def test_checker_passes_its_solution(name, request, no_leftovers, capsys):
    # A checker that takes a cluster runs on the module's shared one of 6 ranks (the notebooks run those that
    # start their own: 01 and 02 check without cluster=); one that needs another size (choose_mesh: 8) starts
    # its own, as it does when a learner passes none.
    takes_cluster = "cluster" in inspect.signature(catalog.get(name).checker).parameters
    fixed_size = getattr(inspect.getmodule(catalog.get(name).checker), "WORLD_SIZE", None)
    shared = takes_cluster and fixed_size in (None, 6)
    options = {"cluster": request.getfixturevalue("bare6")} if shared else {}
    report = workbook.verify_solution(name, **options)
    assert getattr(report, "passed", True)
    assert "passed" in capsys.readouterr().out


def test_registry_is_consistent():
    for exercise in catalog.EXERCISES:
        assert exercise.solution is getattr(solutions, exercise.name), exercise.name
        assert exercise.signature.startswith(exercise.name + "("), exercise.name
        assert len(exercise.hints) >= 2, exercise.name
        assert (NOTEBOOKS / f"{exercise.notebook}.ipynb").exists(), exercise.notebook


# -- the notebooks as shipped ---------------------------------------------------------------------

def exercise_cells(path: Path) -> list[tuple[int, str]]:
    """(cell index, exercise name) for each code cell tagged 'exercise'."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "exercise" in cell.metadata.get("tags", []):
            names = [e.name for e in catalog.EXERCISES if f"def {e.name}(" in cell.source]
            assert len(names) == 1, f"{path.name} cell {i} defines {names}, not one registered exercise"
            found.append((i, names[0]))
    return found


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb")), ids=lambda p: p.name)
def test_notebook_ships_stubs_and_checks(path):
    nb = nbformat.read(path, as_version=4)
    cells = exercise_cells(path)
    assert cells, f"{path.name} has no cell tagged 'exercise'"
    for i, name in cells:
        namespace = {}
        stub = nb.cells[i].source
        exec(compile(stub, f"<{path.name} cell {i}>", "exec"), namespace)  # noqa: S102 - our own notebook
        with pytest.raises(NotImplementedError):
            namespace[name](*[None] * len(catalog.get(name).signature.split(",")))
        check = nb.cells[i + 1]
        assert f'workbook.check("{name}", {name}' in check.source, f"{path.name}: no check after cell {i}"
        assert "# NBVAL_CHECK_OUTPUT" in check.source
        assert check.outputs[0]["text"].startswith(f"{name}: not written yet: replace the NotImplementedError")
    assert {e.name for e in catalog.EXERCISES if e.notebook == path.stem} == {n for _, n in cells}


# -- a stub, a wrong answer, a right one ----------------------------------------------------------

def my_share(rank, world_size, num_items):
    """The stub as shipped."""
    raise NotImplementedError("replace this line with your code")


def bare_stub(rank, world_size, num_items):
    raise NotImplementedError


def gives_everything_to_rank_0(rank, world_size, num_items):
    return list(range(num_items)) if rank == 0 else []


def strided_share(rank, world_size, num_items):
    return list(range(rank, num_items, world_size))


def test_stub_is_recognised():
    assert workbook.is_stub(my_share) and workbook.is_stub(bare_stub)
    assert not workbook.is_stub(strided_share) and not workbook.is_stub(print)


def test_stub_gets_a_friendly_line_and_no_error(record, capsys):
    assert workbook.check("my_share", my_share) is None
    assert capsys.readouterr().out == (
        "my_share: not written yet: replace the NotImplementedError in my_share (the cell above) with your "
        "code, then run both cells again. workbook.hint('my_share') gives a hint.\n")
    assert recorded(record) == {"my_share": workbook.NOT_WRITTEN}


def test_an_answer_still_raising_not_implemented_counts_as_not_written(record, capsys):
    def half_written(rank, world_size, num_items):
        if rank == 0:
            return []
        raise NotImplementedError("the other ranks")

    assert workbook.check("my_share", half_written) is None
    assert "not written yet" in capsys.readouterr().out


def test_wrong_answer_gets_the_checkers_explanation(record):
    with pytest.raises(ExerciseFailed) as info:
        workbook.check("my_share", gives_everything_to_rank_0)
    assert ("world_size 4, 13 items: shares of {0: 13, 1: 0, 2: 0, 3: 0} items per rank; balanced shares "
            "differ by at most one item (here 3 or 4)") in info.value.failures
    assert info.value._render_traceback_() == [f"\x1b[31mExerciseFailed\x1b[0m: {info.value}"]
    assert recorded(record) == {"my_share": workbook.FAILED}


def test_right_answer_says_so(record, capsys):
    assert workbook.check("my_share", strided_share).passed
    assert capsys.readouterr().out.startswith("my share: passed all 5 cases")
    assert recorded(record) == {"my_share": workbook.PASSED}


def test_my_share_names_missing_and_doubled_items():
    def overlaps(rank, world_size, num_items):
        return list(range(num_items))[: num_items // world_size + 1] if rank == 0 else \
            list(range(rank * num_items // world_size, (rank + 1) * num_items // world_size))

    def forgets_the_rest(rank, world_size, num_items):
        return list(range(rank * (num_items // world_size), (rank + 1) * (num_items // world_size)))

    with pytest.raises(ExerciseFailed) as info:
        check_launch.check_my_share(overlaps, world_sizes=(2,), num_items=(4,))
    assert info.value.failures == ["world_size 2, 4 items: item 2 is handled by ranks [0, 1] (1 item(s) twice); "
                                   "each item must belong to exactly one rank"]
    with pytest.raises(ExerciseFailed) as info:
        check_launch.check_my_share(forgets_the_rest, world_sizes=(4,), num_items=(13,))
    assert info.value.failures == ["world_size 4, 13 items: no rank handles item(s) [12] (the last num_items % "
                                   "world_size = 1: a share of num_items // world_size items per rank leaves the "
                                   "remainder out; let rank r start at r * num_items // world_size and stop where "
                                   "rank r + 1 starts)"]
    with pytest.raises(ExerciseFailed, match=r"rank 0: expected a list of item numbers such as \[0, 1, 2\], "
                                             r"got int 3"):
        check_launch.check_my_share(lambda rank, world_size, num_items: 3, world_sizes=(1,), num_items=(3,))


def test_slurm_names_the_wrong_variable():
    def first_bracket_wrong(env):
        right = solutions.slurm_to_torchrun(env)
        return {**right, "MASTER_ADDR": env["SLURM_NODELIST"].split(",")[0], "MASTER_PORT": 29500}

    with pytest.raises(ExerciseFailed) as info:
        check_launch.check_slurm_to_torchrun(first_bracket_wrong, cases=check_launch.SLURM_CASES[:2])
    assert info.value.failures == [
        "SLURM_PROCID=1, SLURM_NTASKS=2, SLURM_LOCALID=0, SLURM_NODELIST=node[07-08], MASTER_PORT=29500: "
        "expected MASTER_ADDR='node07', got 'node[07-08]' (the first host of SLURM_NODELIST, with its "
        "brackets expanded)",
        "SLURM_PROCID=1, SLURM_NTASKS=2, SLURM_LOCALID=0, SLURM_NODELIST=node[07-08], MASTER_PORT=29500: "
        "MASTER_PORT is int 29500; environment variables are strings (os.environ refuses anything else): "
        "MASTER_PORT='29500'",
        "SLURM_PROCID=0, SLURM_NTASKS=1, SLURM_LOCALID=0, SLURM_NODELIST=laptop: MASTER_PORT is int 29500; "
        "environment variables are strings (os.environ refuses anything else): MASTER_PORT='29500'"]
    with pytest.raises(ExerciseFailed, match="expected a dict such as"):
        check_launch.check_slurm_to_torchrun(lambda env: "RANK=0", cases=check_launch.SLURM_CASES[:1])


# -- hints and solutions -----------------------------------------------------------------------

def test_hints_come_one_at_a_time_then_point_to_the_solution(capsys):
    hints = catalog.get("ring_shift").hints
    for n, text in enumerate(hints, 1):
        workbook.hint("ring_shift")
        assert capsys.readouterr().out == f"ring_shift, hint {n} of {len(hints)}: {text}\n"
    workbook.hint("ring_shift")
    assert capsys.readouterr().out == ("ring_shift: that was the last hint. workbook.solution('ring_shift') "
                                       "shows one solution.\n")
    workbook.hint("my_share")  # each exercise counts its own hints
    assert capsys.readouterr().out.startswith("my_share, hint 1 of")


def test_solution_prints_code_that_defines_a_passing_function(capsys):
    workbook.solution("pipeline_time")
    out = capsys.readouterr().out
    assert f"%load -s pipeline_time {solutions.__file__}" in out
    namespace = {"math": __import__("math")}
    exec(out, namespace)  # noqa: S102 - the comment lines are Python comments
    assert workbook.check("pipeline_time", namespace["pipeline_time"]).passed


# -- bad input ----------------------------------------------------------------------------------

def test_not_a_function_is_explained():
    with pytest.raises(ConfigError, match=r"pass your function itself, my_share\(rank, world_size, "
                                          r"num_items\), not str 'my_share'"):
        workbook.check("my_share", "my_share")


def test_wrong_signature_is_explained():
    def ring_shift(rank, tensor):
        return tensor

    with pytest.raises(ConfigError) as info:
        workbook.check("ring_shift", ring_shift)
    assert str(info.value).startswith(
        "the checker calls your function with 3 argument(s), ring_shift(rank, world_size, tensor), but "
        "ring_shift(rank, tensor) cannot be called that way")
    assert str(info.value).endswith("Change its first line to take (rank, world_size, tensor).")


def test_unknown_exercise_lists_the_names():
    with pytest.raises(ConfigError, match="there is no exercise called 'ringshift'; the exercises are my_share, "):
        workbook.hint("ringshift")


def everyone_sends_first(rank, world_size, tensor):
    dist.send(tensor, (rank + 1) % world_size)
    received = tensor.clone()
    dist.recv(received, (rank - 1) % world_size)
    return received


@pytest.mark.slow
def test_deadlocking_answer_times_out_and_leaves_the_cluster_usable(no_leftovers, record):
    with ppkit.Cluster(2, "gloo", process_group=False) as bare:
        with pytest.raises(ExerciseFailed) as info:
            workbook.check("ring_shift", everyone_sends_first, world_sizes=(2,), sizes=(1,), timeout=3,
                           cluster=bare)
        assert "did not finish within 3 s" in str(info.value)
        assert "Every rank is in dist.send and none has posted its recv" in str(info.value)
        assert bare.state == "ready"
        assert workbook.check("ring_shift", solutions.ring_shift, world_sizes=(2,), sizes=(1,),
                              cluster=bare).passed
    assert recorded(record) == {"ring_shift": workbook.PASSED}


# -- progress -----------------------------------------------------------------------------------

def test_progress_lists_every_exercise_with_its_last_outcome(record, capsys):
    workbook.check("my_share", strided_share)
    workbook.check("slurm_to_torchrun", solutions.slurm_to_torchrun)
    with pytest.raises(ExerciseFailed):
        workbook.check("pipeline_time", lambda forward_times, backward_times, batch_size, microbatch_size: 0)
    capsys.readouterr()
    rows = workbook.progress_rows()
    assert [r["name"] for r in rows] == [e.name for e in catalog.EXERCISES]
    status = {r["name"]: r["status"] for r in rows}
    assert status["my_share"] == status["slurm_to_torchrun"] == workbook.PASSED
    assert status["pipeline_time"] == workbook.FAILED and status["ring_shift"] == workbook.NOT_TRIED

    assert cli(["exercises"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["00_start_here", "my_share", "passed"]
    assert out[-1] == f"2 of {len(catalog.EXERCISES)} exercises passed on this machine ({record})"


def test_unreadable_record_is_said_and_ignored(record, capsys):
    record.mkdir()
    (record / progress_format.CURRENT).write_text("{not json\n")
    assert all(r["status"] == workbook.NOT_TRIED for r in workbook.progress_rows())
    assert "the progress record could not be read in full: 1 line(s) not JSON" in capsys.readouterr().err


def test_cli_verify_runs_checkers_on_solutions(monkeypatch, capsys):
    broken = catalog.Exercise("pipeline_time", "06_pipeline", catalog.get("pipeline_time").signature,
                              lambda fn: check_launch.check_my_share(fn), solutions.pipeline_time, ("a", "b"))
    monkeypatch.setattr(catalog, "BY_NAME", {**catalog.BY_NAME, "pipeline_time": broken})
    monkeypatch.setattr(catalog, "EXERCISES", (catalog.get("my_share"), broken))
    assert cli(["exercises", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "00_start_here my_share: my share: passed all 5 cases" in out
    assert "06_pipeline pipeline_time: FAILED on its own solution: " in out
    assert out.splitlines()[-1] == ("1 of 2 checkers pass on their solutions on this machine; "
                                    "failed: pipeline_time")
