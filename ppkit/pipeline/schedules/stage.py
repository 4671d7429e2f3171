"""ResNet50 as stages of ``torch.distributed.pipelining``: one stage per rank (GPipe, 1F1B) or two
(Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV; ``ppkit.pipeline.schedules.placement``).

Each rank of a ppkit cluster builds its manual ``PipelineStage`` s and the schedule that feeds them
micro-batches. The stages talk over a gloo group of their own, created with a short timeout, so a
stage waiting for a tensor that never comes raises ``StageTimeoutError`` instead of hanging for the
default process group's 30 minutes.

    x, y = make_batch(batch_size=8, image_size=32)
    ranks = cluster.run(train_step, x, y, schedule="1f1b", num_microbatches=4)  # one dict per rank
    # ppkit.pipeline.schedules.compare.run_schedule(cluster, x, y, "1f1b") merges them into a ScheduleRun
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining

from ppkit.checks import positive
from ppkit.errors import ConfigError, StageTimeoutError
from ppkit.pipeline.schedules import placement
from ppkit.pipeline.schedules.memory import ActivationMeter
from ppkit.pipeline.schedules.plan import plan_of
from ppkit.pipeline.schedules.timed_stage import TimedStage, example_tensors, shards_for

SCHEDULES = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}  # one stage per rank
LOSSES = {"cross_entropy": nn.functional.cross_entropy,  # labels are class numbers
          "mse": nn.functional.mse_loss}  # labels are one-hot rows (the RPC tutorial's loss)
NUM_CLASSES = 1000  # torchvision's ResNet50 head, as in the RPC tutorial


def check_schedule(schedule: str) -> str:
    """``schedule`` if it is one of the one-stage-per-rank :data:`SCHEDULES`."""
    if schedule not in SCHEDULES:
        more = (f" ({schedule} puts two stages on each rank: run it with compare.run_looped)"
                if schedule in placement.SPECS else "")
        raise ConfigError(f"unknown schedule {schedule!r}{more}; the one-stage-per-rank schedules "
                          f"of torch.distributed.pipelining here are {', '.join(SCHEDULES)}.")
    return schedule


def microbatch_size_of(batch_size: int, num_microbatches: int) -> int:
    """The micro-batch size; the batch must split into equal micro-batches."""
    if num_microbatches < 1 or batch_size % num_microbatches:
        raise ConfigError(
            f"a batch of {batch_size} does not split into {num_microbatches} equal micro-batches. "
            "Equal micro-batches keep the mean of the micro-batch losses equal to the batch loss; "
            "pick num_microbatches that divides the batch size.")
    return batch_size // num_microbatches


def make_batch(batch_size: int = 8, image_size: int = 32, seed: int = 0,
               num_classes: int = NUM_CLASSES) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic random batch of images and class labels."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
    y = torch.randint(0, num_classes, (batch_size,), generator=gen)
    return x, y


def stage_example_tensors(cut: str, microbatch_size: int, image_size: int) -> list[torch.Tensor]:
    """Meta tensors of one micro-batch at each stage boundary: [input, activation at cut, logits]
    (:func:`ppkit.pipeline.schedules.timed_stage.example_tensors` for one cut)."""
    return example_tensors((cut,), microbatch_size, image_size)


def _pipeline_group(world_size: int, p2p_timeout: float):
    """A gloo group for the stages' send/recv whose operations give up after ``p2p_timeout`` s.

    The timeout must be set when the group is made: ``dist.set_timeout`` on an existing gloo group
    did not shorten a pending recv in torch 2.14.1.
    """
    group = dist.new_group(list(range(world_size)), timeout=timedelta(seconds=p2p_timeout),
                           backend="gloo")
    dist.barrier(group=group)
    return group


def _explain_timeout(exc: Exception, stages: list[TimedStage], schedule: str, p2p_timeout: float):
    """A StageTimeoutError that says what the stage waited for, or None if ``exc`` is another error."""
    text = str(exc)
    if "Timed out" in text and "for send" in text:
        what = f"waited more than {p2p_timeout:g} s for its neighbour stage to receive a tensor it sent"
    elif "Timed out" in text:
        what = f"waited more than {p2p_timeout:g} s for a tensor from its neighbour stage"
    elif "Connection closed" in text:
        what = "lost its connection to its neighbour stage, which gave up or died"
    else:
        return None
    events = sorted((e for stage in stages for e in stage.events), key=lambda e: e[4])
    kinds = {"F": "forward", "B": "backward", "I": "input-gradient backward", "W": "weight-gradient backward"}
    done = (f"its last finished step: {kinds[events[-1][1]]} of micro-batch {events[-1][2]}"
            + (f" on stage {events[-1][0] + 1}" if len(stages) > 1 else "")
            if events else "it had not finished any micro-batch")
    rank = dist.get_rank()
    names = " and ".join(str(stage.stage_index + 1) for stage in stages)
    return StageTimeoutError(
        f"stage{'s' if len(stages) > 1 else ''} {names} of {stages[0].num_stages} (rank {rank}) of the "
        f"{schedule} pipeline {what} "
        f"({done}). Usually the stages disagree (num_microbatches, batch or image size, cut) or "
        "the neighbour stage failed: see its error. Run cluster.restart() before the next pipeline "
        f"step, or raise p2p_timeout if the stages are only slow.\ngloo said: {text.splitlines()[0]}",
        stage=stages[0].stage_index, process=f"rank {rank}")


def _check_options(schedule, world_size, steps, num_threads, loss, lr, p2p_timeout) -> None:
    placement.spec_of(schedule)
    positive(p2p_timeout, "p2p_timeout")
    if lr is not None:
        positive(lr, "lr", "a positive learning rate or None")
    if loss not in LOSSES:
        raise ConfigError(f"unknown loss {loss!r}; choose from {', '.join(LOSSES)}.")
    if world_size != 2:
        raise ConfigError(f"these ResNet50 pipelines run on 2 ranks (2 or 4 stages), so they need a 2-rank "
                          f"cluster, not {world_size}.")
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}.")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise ConfigError(f"num_threads must be a positive number of threads or None, got {num_threads!r}.")


def build_schedule(module: nn.Module, rank: int, world_size: int, examples: list[torch.Tensor], group,
                   schedule: str, num_microbatches: int, loss_fn):
    """This rank's ``PipelineStage`` and the schedule that drives it."""
    stage = TimedStage(module, stage_index=rank, num_stages=world_size, device=torch.device("cpu"),
                       input_args=examples[rank],       # what this stage receives, and what it
                       output_args=examples[rank + 1],  # sends (meta tensors: only the shapes)
                       group=group)                     # gloo, with a short timeout
    return stage, SCHEDULES[schedule](stage, n_microbatches=num_microbatches, loss_fn=loss_fn)


def build_looped_schedule(modules: list[nn.Module], stage_indices: list[int], num_stages: int,
                          examples: list[torch.Tensor], group, schedule: str, num_microbatches: int, loss_fn):
    """This rank's ``PipelineStage`` s (two of them: ``stage_indices``) and the schedule that drives
    them all; the same pattern with a list of stages."""
    stages = [TimedStage(module, stage_index=s, num_stages=num_stages, device=torch.device("cpu"),
                         input_args=examples[s], output_args=examples[s + 1], group=group)
              for module, s in zip(modules, stage_indices)]
    torch_class = getattr(pipelining, placement.spec_of(schedule).torch_name)
    return stages, torch_class(stages, n_microbatches=num_microbatches, loss_fn=loss_fn)


def step_once(stages, schedule, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """One step on this rank; the rank holding the last stage returns its micro-batches' losses."""
    stages = stages if isinstance(stages, list) else [stages]
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    losses: list[torch.Tensor] = []
    if first and last:  # a V placement: this rank holds the first stage and the last
        schedule.step(x, target=y, losses=losses)
    elif first:
        schedule.step(x)  # cut into micro-batches and fed through the pipeline
    elif last:
        schedule.step(target=y, losses=losses)  # the labels live on the last stage
    else:
        schedule.step()  # stages in the middle only pass activations and gradients on
    return losses


def train_step(rank: int, world_size: int, x, y, schedule: str = "gpipe", *,
               num_microbatches: int = 4, cut=None, seed: int = 0, steps: int = 1,
               p2p_timeout: float = 30.0, num_threads: int | None = 1, return_grads: bool = True,
               loss: str = "cross_entropy", train_mode: bool = False, lr: float | None = None) -> dict:
    """This rank's stages of a ResNet50 pipeline on 2 ranks: ``steps`` forward+backward steps.

    Run it on every rank with ``cluster.run(train_step, x, y, schedule=...)``. ``schedule`` is one of
    ``placement.SPECS``: GPipe and 1F1B put one stage on each rank (ResNet50 cut at ``cut``, default
    the tutorial's ``layer2``), the others two (``cut`` = three cut points, default
    ``placement.FOUR_STAGE_CUTS``). ``x`` and ``y`` are a batch of images and labels, or lists of
    batches that the steps take in turn. By default BatchNorm is in eval mode, so cutting the batch
    into micro-batches does not change the result: the loss and gradients equal a local model's
    (``verify.reference_step``), and no optimizer step is taken. ``train_mode=True`` and ``lr`` (an
    SGD step per shard after every backward) do the RPC tutorial's training instead, on fresh
    shards; ``loss="mse"`` takes one-hot labels. ``num_threads`` (default 1: a core per rank, as a
    GPU per rank would be) is restored after. Returns this rank's loss (the rank with the last
    stage), gradients per stage, step times, timeline of every F/B/I/W, the schedule's plan and the
    peak bytes of activations kept for backward.
    """
    _check_options(schedule, world_size, steps, num_threads, loss, lr, p2p_timeout)
    cuts = placement.stage_cuts(schedule, world_size, cut)
    placement.check_microbatches(schedule, world_size, num_microbatches)
    xs, ys = (list(x), list(y)) if isinstance(x, (list, tuple)) else ([x], [y])
    if not xs or len(xs) != len(ys) or len({tuple(b.shape) for b in xs}) != 1:
        raise ConfigError("give one batch of images and labels, or equally long lists of batches "
                          "of the same shape.")
    microbatch_size = microbatch_size_of(len(xs[0]), num_microbatches)
    examples = example_tensors(cuts, microbatch_size, xs[0].shape[-1])
    mine = placement.stages_of_rank(schedule, rank, world_size)
    modules = shards_for(cuts, seed, mine, train_mode, lr)
    local = nn.ModuleList(modules)  # this rank's parameters, for the optimizer and the meter
    optimizer = None if lr is None else torch.optim.SGD(local.parameters(), lr=lr)
    group = _pipeline_group(world_size, p2p_timeout)
    if len(mine) == 1:
        stage, sched = build_schedule(modules[0], rank, world_size, examples, group, schedule,
                                      num_microbatches, LOSSES[loss])
        stages = [stage]
    else:
        stages, sched = build_looped_schedule(modules, mine, len(cuts) + 1, examples, group, schedule,
                                              num_microbatches, LOSSES[loss])
    meter = ActivationMeter(local)
    step_times, losses = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads or threads)
    try:
        for i in range(steps):
            local.zero_grad(set_to_none=True)
            for stage in stages:
                stage.events = []
            meter.reset_peak()
            dist.barrier(group=group)
            start = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                losses = step_once(stages, sched, xs[i % len(xs)], ys[i % len(ys)])
            if optimizer is not None:
                optimizer.step()
            step_times.append(time.perf_counter() - start)
        dist.barrier(group=group)
    except RuntimeError as exc:
        better = _explain_timeout(exc, stages, schedule, p2p_timeout)
        if better is None:
            raise
        raise better from exc  # the group is left alone: destroying it could block
    finally:
        torch.set_num_threads(threads)
    dist.destroy_process_group(group)
    return {
        "rank": rank, "stage": mine[0], "stages": mine, "schedule": schedule,
        "num_microbatches": num_microbatches, "microbatch_size": microbatch_size, "cuts": cuts,
        "step_times": step_times, "step_start": start,
        "events": sorted((e for stage in stages for e in stage.events), key=lambda e: e[3]),
        # torch's plan for the runtime schedules (it is what they run); GPipe's and 1F1B's plan is
        # only drawn by torch, and 2.14.1's 1F1B one is off by a micro-batch on the last stage
        "plan": plan_of(sched) if len(mine) > 1 else None, "peak_activation_bytes": meter.peak,
        "loss": torch.stack(losses).mean().item() if losses else None,
        "grads": ({s: {name: p.grad.clone() for name, p in module.named_parameters()}
                   for s, module in zip(mine, modules)} if return_grads else None),
    }
