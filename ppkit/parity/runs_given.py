"""What ``compare_runs`` (compare.py) is handed, checked: the reference and each rank's run (a ParityRun or its
recorder; a list by rank, a dict, or one run), the ranks that handed back nothing, and the steps to compare."""

from __future__ import annotations

from collections.abc import Mapping

from ppkit.errors import ConfigError
from ppkit.parity.record import ParityRecorder, ParityRun


def absent_ranks(runs) -> list[int]:
    """Ranks of the run that handed back nothing (None), where the others say how many ranks there were."""
    items = list(runs.values() if isinstance(runs, Mapping) else runs) if isinstance(runs, (list, tuple, Mapping)) \
        else []
    found = [obj.run if isinstance(obj, ParityRecorder) else obj for obj in items]
    found = [run for run in found if isinstance(run, ParityRun)]
    size = max((run.world_size for run in found), default=0)
    return sorted(set(range(size)) - {run.rank for run in found})


def as_run(obj, label: str) -> ParityRun:
    if isinstance(obj, ParityRecorder):
        return obj.run
    if isinstance(obj, ParityRun):
        return obj
    raise ConfigError(f"compare_runs: the {label} is a {type(obj).__name__}; give what a ParityRecorder recorded "
                      "(recorder.run, returned from the rank function).")


def as_runs(runs, kind: str) -> dict[int, ParityRun]:
    if isinstance(runs, (ParityRun, ParityRecorder)):
        runs = [runs]
    items = runs.values() if isinstance(runs, Mapping) else runs
    if not isinstance(items, (list, tuple, type({}.values()))):
        raise ConfigError(f"compare_runs: the parallel run is a {type(runs).__name__}; give the list cluster.run "
                          "returned (each rank's recorder.run).")
    found: dict[int, ParityRun] = {}
    for obj in items:
        if obj is None:
            continue
        run = as_run(obj, "parallel run's entry")
        if run.rank in found:
            raise ConfigError(f"compare_runs: two runs say they are rank {run.rank}; give each rank's run once.")
        if run.kind != kind:
            raise ConfigError(f"rank {run.rank} recorded {run.kind}, the reference {kind}: record the same with "
                              f"ParityRecorder(what={kind!r}) on both sides.")
        found[run.rank] = run
    if not found:
        raise ConfigError("compare_runs: no rank recorded anything: return recorder.run from the rank function.")
    return dict(sorted(found.items()))


def common_steps(ref: ParityRun, ranks: dict[int, ParityRun]) -> list[int]:
    for rank, run in ranks.items():
        extra = sorted(set(run.steps) - set(ref.steps))
        if extra:
            raise ConfigError(f"rank {rank} recorded steps {extra}, which the reference did not (it has "
                              f"{_span(ref.steps)}): run the reference for as many steps, numbered the same.")
    steps = sorted(set().union(*(run.steps for run in ranks.values())))
    if not steps:
        raise ConfigError("compare_runs: the ranks recorded no step: call recorder.record(step, model, loss) "
                          "once per step.")
    return steps


def _span(steps: list[int]) -> str:
    return f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
