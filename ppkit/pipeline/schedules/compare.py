"""RPC, GPipe and 1F1B on the same batch: each schedule run for a few steps, in turns; and every
schedule of ``placement.SPECS`` (two stages per rank past 1F1B) measured per rank.

    x, y = make_batch(8, 32)
    runs = compare_schedules(cluster, model, x, y, num_microbatches=4)   # model: an RPC PipelineModel
    print(report.format_table(runs)); report.plot_timelines(runs)
    looped = compare_looped(cluster, x, y, num_microbatches=4)           # name -> LoopedRun

Each run is a ``ScheduleRun`` (``ppkit.pipeline.schedules.schedule_run``); ``ppkit.pipeline.schedules.verify``
checks it against one local ResNet50 and ``ppkit.pipeline.schedules.report`` tabulates and draws it.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ppkit.errors import ConfigError
from ppkit.pipeline.schedules import placement
from ppkit.pipeline.schedules.bubble_model import KINDS, check_kind
from ppkit.pipeline.schedules.looped_run import LoopedRun, merge_looped
from ppkit.pipeline.schedules.schedule_run import ScheduleRun, merge_ranks
from ppkit.pipeline.schedules.stage import check_schedule, microbatch_size_of, train_step
from ppkit.pipeline.timeline import Timeline


def run_schedule(cluster, x: torch.Tensor, y: torch.Tensor, schedule: str = "gpipe", *,
                 timeout: float | None = None, **options) -> ScheduleRun:
    """``train_step`` on every rank of a 2-rank ``cluster``, merged into one :class:`ScheduleRun`."""
    check_schedule(schedule)
    return merge_ranks(cluster.run(train_step, x, y, schedule, timeout=timeout, **options))


def _set_num_threads(num_threads: int) -> int:
    """On a stage's process: its stages compute with ``num_threads`` (each stage thread takes it
    before its next micro-batch, resources.sync_threads); returns the count they had."""
    from ppkit.pipeline.rpc.resources import want_threads

    return want_threads(num_threads)


def rpc_step(model, x: torch.Tensor, y: torch.Tensor, num_microbatches: int = 4, *, steps: int = 1,
             num_threads: int | None = 1, return_grads: bool = True) -> ScheduleRun:
    """The same steps through the RPC ``PipelineModel`` (eval mode, no optimizer step).

    The driver (this process) sends every micro-batch, gathers the logits, computes the loss and
    runs ``dist_autograd.backward``; the shards' timing events give the timeline. ``num_threads``
    per stage process, as in ``train_step`` (restored after).
    """
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc

    model.eval()
    model.microbatch_size = microbatch_size_of(len(x), num_microbatches)
    processes = dict.fromkeys(p.process for p in model.placement)
    if num_threads is not None:
        processes = {name: rpc.rpc_sync(name, _set_num_threads, args=(num_threads,)) for name in processes}
    model.drain_events()
    step_times, grads = [], None
    try:
        for i in range(steps):
            start = time.time()
            with dist_autograd.context() as context_id:
                loss = nn.functional.cross_entropy(model(x), y)
                dist_autograd.backward(context_id, [loss])
                step_times.append(time.time() - start)
                if return_grads and i == steps - 1:
                    grads = model.gradients(context_id)
            raw = model.drain_events()
    finally:
        for name, previous in processes.items():
            if previous is not None:
                rpc.rpc_sync(name, _set_num_threads, args=(previous,))
    timeline = Timeline.from_raw(raw, model.stage_labels(), num_microbatches, origin=start)
    return ScheduleRun("rpc", num_microbatches, model.microbatch_size, loss.item(), grads, step_times,
                       timeline)


def compare_schedules(cluster, model, x: torch.Tensor, y: torch.Tensor, num_microbatches: int = 4, *,
                      steps: int = 2, rounds: int = 1, schedules=KINDS,
                      timeout: float | None = None, **options) -> dict[str, ScheduleRun]:
    """Every schedule on the same batch and micro-batches: RPC through ``model`` (a
    ``PipelineModel``), GPipe and 1F1B on the 2-rank ``cluster``.

    Each round runs every schedule in turn for one warm-up step and ``steps`` timed steps, so a
    machine that gets busier or quieter affects all of them alike. The result keeps the last
    round's gradients and timeline and the timed steps of every round. ``options`` go to
    ``train_step`` (``cut`` and ``seed`` must be the RPC model's).
    """
    if steps < 1 or rounds < 1:
        raise ConfigError(f"steps and rounds must be at least 1, got steps={steps}, rounds={rounds}.")
    for schedule in schedules:
        check_kind(schedule)
    if "rpc" in schedules:
        for name in ("cut", "seed"):
            if name in options and options[name] != getattr(model, name):
                raise ConfigError(f"{name}={options[name]!r} differs from the RPC model's "
                                  f"{getattr(model, name)!r}: compare the same shards.")
            options.setdefault(name, getattr(model, name))
    runs: dict[str, ScheduleRun] = {}
    timed: dict[str, list[float]] = {schedule: [] for schedule in schedules}
    for _ in range(rounds):
        for schedule in schedules:
            if schedule == "rpc":
                run = rpc_step(model, x, y, num_microbatches, steps=steps + 1)
            else:
                run = run_schedule(cluster, x, y, schedule, num_microbatches=num_microbatches,
                                   steps=steps + 1, timeout=timeout, **options)
            timed[schedule] += run.step_times[1:]
            runs[schedule] = run
    for schedule, run in runs.items():
        run.step_times, run.warmup_steps = timed[schedule], 0
    return runs


def _two_ranks(cluster) -> int:
    if cluster.world_size != 2:
        raise ConfigError(f"these ResNet50 pipelines run on 2 ranks; this cluster has {cluster.world_size}. "
                          "Start one with ppkit.Cluster(2, 'gloo').")
    return cluster.world_size


def run_looped(cluster, x, y, schedule: str, *, num_microbatches: int = 4, cut=None,
               timeout: float | None = None, **options) -> LoopedRun:
    """``train_step`` of any schedule on every rank of a 2-rank ``cluster``, merged per rank.

    Impossible settings (a micro-batch count the schedule cannot take, a batch that does not split
    into it, a wrong number of cut points) are refused here, in this process, before any rank runs:
    the cluster stays as it was.
    """
    placement.spec_of(schedule)
    num_ranks = _two_ranks(cluster)
    cuts = placement.stage_cuts(schedule, num_ranks, cut)
    placement.check_microbatches(schedule, num_ranks, num_microbatches)
    batch = x[0] if isinstance(x, (list, tuple)) else x
    microbatch_size_of(len(batch), num_microbatches)
    return merge_looped(cluster.run(train_step, x, y, schedule, num_microbatches=num_microbatches, cut=cuts,
                                    timeout=timeout, **options))


def compare_looped(cluster, x, y, num_microbatches: int = 4, *, schedules=tuple(placement.SPECS),
                   steps: int = 2, rounds: int = 1, timeout: float | None = None, **options) -> dict[str, LoopedRun]:
    """Every schedule in ``schedules`` on the same batch and micro-batches (GPipe and 1F1B cut at the
    tutorial's ``layer2``, the others into four stages), checked before the first one runs.

    Each round runs every schedule in turn for one warm-up step and ``steps`` timed ones, so a
    machine that gets busier or quieter affects all of them alike. The result keeps the last round's
    timeline and gradients and the timed steps of every round (``step_times``; ``round_times``: the
    median of each round, for ratios within a round).
    """
    if steps < 1 or rounds < 1:
        raise ConfigError(f"steps and rounds must be at least 1, got steps={steps}, rounds={rounds}.")
    num_ranks = _two_ranks(cluster)
    for schedule in schedules:
        placement.check_microbatches(schedule, num_ranks, num_microbatches)
    runs: dict[str, LoopedRun] = {}
    timed: dict[str, list[list[float]]] = {schedule: [] for schedule in schedules}
    for _ in range(rounds):
        for schedule in schedules:
            run = run_looped(cluster, x, y, schedule, num_microbatches=num_microbatches, steps=steps + 1,
                             timeout=timeout, **options)
            timed[schedule].append(run.step_times[1:])
            runs[schedule] = run
    for schedule, run in runs.items():
        run.step_times, run.warmup_steps = [t for times in timed[schedule] for t in times], 0
        run.round_times = [statistics.median(times) for times in timed[schedule]]
    return runs
