"""Every exercise of the course with its code: ``EXERCISES``, the plain data of ``course.py`` joined to each one's
checker and solution.

An exercise is a checker, a solution and a list of hints. To add one:

1. write its checker, ``check_x(fn, **options) -> CheckReport``, in a ``check_*`` module of ppkit/exercises: it
   raises ``ExerciseFailed`` naming the case, what it expected and what it got
   (``ppkit.checks.check_callable`` refuses a non-function or a wrong signature for you);
2. write one solution in ``ppkit/exercises/solutions.py``, a function named like the exercise, exactly
   as it would stand in the notebook;
3. add its entry to ``ppkit/exercises/course.py`` (name, notebook, signature, hints: plain data, which the
   instructor's ``ppkit room`` reads too) and its code to ``_CODE`` below (checker, solution; a ``context`` only
   when the checker needs something the notebook provides, such as an RPC world);
4. in the notebook: the statement in markdown, a code cell tagged ``exercise`` holding the stub
   (the signature, a docstring, ``raise NotImplementedError(...)``), and a cell
   ``workbook.check("x", x)`` whose output, "x: not written yet: ...", is kept with
   ``# NBVAL_CHECK_OUTPUT``.

``tests/test_lessons_workbook.py`` then runs the checker against the solution and
nbval runs the notebook with the solution in the exercise cell (``tests/solved_notebooks.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import (
    check_attention,
    check_basics,
    check_collective_bug,
    check_composition,
    check_debugging,
    check_launch,
    check_memory,
    check_moe,
    check_overlap,
    check_parity,
    check_pipeline,
    check_sequence,
    check_sharding,
    check_speed,
    check_throughput,
    course,
    solutions,
)
from ppkit.lessons import rpc_basics


@dataclass(frozen=True)
class Exercise:
    name: str                   # also the name of the function the learner writes
    notebook: str               # file name without .ipynb
    signature: str              # how the checker calls it: "ring_shift(rank, world_size, tensor)"
    checker: Callable           # checker(fn, **options) -> CheckReport; raises ExerciseFailed
    solution: Callable          # one correct answer, from ppkit.exercises.solutions
    hints: tuple[str, ...]      # from a nudge to nearly the answer; the solution comes after them
    context: Callable | None = None  # () -> context manager yielding the checker's options outside
    #                                   the notebook (e.g. an RPC world's worker names)


@contextmanager
def _rpc_world():
    from ppkit.cluster.rpc.world import start_rpc

    world = start_rpc(2)
    try:
        yield {"owners": world.worker_names}
    finally:
        world.close()


def _check_remote_sum(fn, owners):
    """rpc_basics' checker in the common shape: ExerciseFailed on a wrong answer, the summary printed."""
    try:
        summary = rpc_basics.check_remote_sum(fn, owners)
    except ExerciseFailed:
        raise
    except AssertionError as err:
        raise ExerciseFailed(f"remote sum: {err}", [str(err)]) from None
    print(summary)
    return summary


# Each exercise of course.EXERCISES, by name: (checker, solution) or (checker, solution, context).
_CODE = {
    "my_share": (check_launch.check_my_share, solutions.my_share),
    "ring_shift": (check_basics.check_ring_shift, solutions.ring_shift),
    "ring_all_reduce": (check_basics.check_ring_all_reduce, solutions.ring_all_reduce),
    "mean_loss": (check_debugging.check_mean_loss, solutions.mean_loss),
    "logged_train_loop": (check_collective_bug.check_logged_train_loop, solutions.logged_train_loop),
    "bucketed_average": (check_basics.check_bucketed_average, solutions.bucketed_average),
    "remote_sum": (_check_remote_sum, solutions.remote_sum, _rpc_world),
    "activation_shape": (check_pipeline.check_activation_shape, solutions.activation_shape),
    "pipeline_time": (check_pipeline.check_pipeline_time, solutions.pipeline_time),
    "best_num_microbatches": (check_pipeline.check_best_num_microbatches, solutions.best_num_microbatches),
    "slurm_to_torchrun": (check_launch.check_slurm_to_torchrun, solutions.slurm_to_torchrun),
    "microbatches_held": (check_pipeline.check_microbatches_held, solutions.microbatches_held),
    "predict_peak": (check_memory.check_predict_peak, solutions.predict_peak),
    "predict_mfu": (check_speed.check_predict_mfu, solutions.predict_mfu),
    "zero2_grad_shard": (check_sharding.check_zero2_grad_shard, solutions.zero2_grad_shard),
    "row_parallel_forward": (check_sharding.check_row_parallel_forward, solutions.row_parallel_forward),
    "sequence_shard_of_sum": (check_sequence.check_sequence_shard_of_sum, solutions.sequence_shard_of_sum),
    "first_bucket": (check_overlap.check_first_bucket, solutions.first_bucket),
    "merge_partials": (check_attention.check_merge_partials, solutions.merge_partials),
    "dispatch_splits": (check_moe.check_dispatch_splits, solutions.dispatch_splits),
    "choose_mesh": (check_composition.check_choose_mesh, solutions.choose_mesh),
    "predict_step": (check_throughput.check_predict_step, solutions.predict_step),
    "tp_mlp": (check_parity.check_tp_mlp, solutions.tp_mlp),
}


def _exercises() -> tuple[Exercise, ...]:
    """course.EXERCISES joined to their code; ConfigError when a name has no code, or code no course entry."""
    names = [entry["name"] for entry in course.EXERCISES]
    unknown = sorted(set(names) ^ set(_CODE))
    if unknown:
        raise ConfigError(f"ppkit/exercises/course.py and catalog.py's _CODE do not name the same exercises: "
                          f"{unknown}; add the missing entry to the other one")
    return tuple(Exercise(entry["name"], entry["notebook"], entry["signature"], *_CODE[entry["name"]][:2],
                          tuple(entry["hints"]), *_CODE[entry["name"]][2:]) for entry in course.EXERCISES)


EXERCISES = _exercises()

BY_NAME = {exercise.name: exercise for exercise in EXERCISES}


def get(name: str) -> Exercise:
    """The exercise called ``name``; a ConfigError listing the names otherwise."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ConfigError(f"there is no exercise called {name!r}; the exercises are "
                          f"{', '.join(BY_NAME)}.") from None
