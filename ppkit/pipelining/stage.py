"""The same two ResNet50 shards as stages of ``torch.distributed.pipelining`` (GPipe, 1F1B).

Each rank of a ppkit cluster is one stage (a manual ``PipelineStage``); ``ScheduleGPipe`` or
``Schedule1F1B`` feeds it micro-batches. The stages talk over a gloo group of their own, created
with a short timeout, so a stage waiting for a tensor that never comes raises
``StageTimeoutError`` instead of hanging for the default process group's 30 minutes.

    x, y = make_batch(batch_size=8, image_size=32)
    ranks = cluster.run(train_step, x, y, schedule="1f1b", num_microbatches=4)  # one dict per stage
    # ppkit.pipelining.compare.run_schedule(cluster, x, y, "1f1b") merges them into a ScheduleRun
"""

from __future__ import annotations

import functools
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ppkit.checks import positive
from ppkit.errors import ConfigError, StageTimeoutError
from ppkit.models.resnet import DEFAULT_CUT, check_cut, resnet50, split_resnet50
from ppkit.pipelining.memory import ActivationMeter

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
LOSSES = {"cross_entropy": nn.functional.cross_entropy,  # labels are class numbers
          "mse": nn.functional.mse_loss}  # labels are one-hot rows (the RPC tutorial's loss)
NUM_CLASSES = 1000  # torchvision's ResNet50 head, as in the RPC tutorial


def check_schedule(schedule: str) -> str:
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown schedule {schedule!r}; torch.distributed.pipelining schedules "
                          f"here are {', '.join(SCHEDULES)}.")
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
    """Meta tensors of one micro-batch at each stage boundary: [input, activation at cut, logits].

    A ``PipelineStage`` given these shapes skips its run-time shape inference (an extra forward and
    backward of the first micro-batch). Meta tensors cost no memory and no compute.
    """
    with torch.device("meta"):
        first, second = split_resnet50(resnet50(), cut)
        x = torch.empty(microbatch_size, 3, image_size, image_size)
        act = first.eval()(x)
        logits = second.eval()(act)
    # the received activation must require grad, or no gradient flows back to the first stage
    return [x, act.detach().requires_grad_(True), logits.detach().requires_grad_(True)]


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that records when each forward and backward of a micro-batch ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, int, float, float]] = []  # (F or B, micro-batch, start, end)

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        start = time.perf_counter()
        out = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        self.events.append(("F", fwd_chunk_id, start, time.perf_counter()))
        return out

    def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
        start = time.perf_counter()
        super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
        self.events.append(("B", bwd_chunk_id, start, time.perf_counter()))


@functools.lru_cache(maxsize=2)
def _eval_shard(cut: str, seed: int, index: int) -> nn.Module:
    """This rank's shard in eval mode, built once per worker (building ResNet50 takes a second);
    steps that change no weights and no BatchNorm statistics can share it."""
    return split_resnet50(resnet50(seed), cut)[index].eval()


def _shard(cut: str, seed: int, index: int, train_mode: bool, lr: float | None) -> nn.Module:
    if train_mode or lr is not None:
        return split_resnet50(resnet50(seed), cut)[index].train(train_mode)
    return _eval_shard(cut, seed, index)


def _pipeline_group(world_size: int, p2p_timeout: float):
    """A gloo group for the stages' send/recv whose operations give up after ``p2p_timeout`` s.

    The timeout must be set when the group is made: ``dist.set_timeout`` on an existing gloo group
    did not shorten a pending recv in torch 2.14.1.
    """
    group = dist.new_group(list(range(world_size)), timeout=timedelta(seconds=p2p_timeout),
                           backend="gloo")
    dist.barrier(group=group)
    return group


def _explain_timeout(exc: Exception, stage: TimedStage, schedule: str, p2p_timeout: float):
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
    last = stage.events[-1] if stage.events else None
    done = (f"its last finished step: {'forward' if last[0] == 'F' else 'backward'} of micro-batch "
            f"{last[1]}" if last else "it had not finished any micro-batch")
    rank = dist.get_rank()
    return StageTimeoutError(
        f"stage {stage.stage_index + 1} of {stage.num_stages} (rank {rank}) of the {schedule} pipeline "
        f"{what} "
        f"({done}). Usually the stages disagree (num_microbatches, batch or image size, cut) or "
        "the neighbour stage failed: see its error. Run cluster.restart() before the next pipeline "
        f"step, or raise p2p_timeout if the stages are only slow.\ngloo said: {text.splitlines()[0]}",
        stage=stage.stage_index, process=f"rank {rank}")


def _check_options(schedule, cut, world_size, steps, num_threads, loss, lr, p2p_timeout) -> None:
    check_schedule(schedule)
    positive(p2p_timeout, "p2p_timeout")
    check_cut(cut)
    if lr is not None:
        positive(lr, "lr", "a positive learning rate or None")
    if loss not in LOSSES:
        raise ConfigError(f"unknown loss {loss!r}; choose from {', '.join(LOSSES)}.")
    if world_size != 2:
        raise ConfigError(f"the ResNet50 split has 2 stages, so it needs a 2-rank cluster, not {world_size}.")
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


def step_once(stage, schedule, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """One step on this rank; the last stage returns its micro-batches' losses."""
    losses: list[torch.Tensor] = []
    if stage.is_first:
        schedule.step(x)  # cut into micro-batches and fed through the pipeline
    else:
        schedule.step(target=y, losses=losses)  # the labels live on the last stage
    return losses


def train_step(rank: int, world_size: int, x, y, schedule: str = "gpipe", *,
               num_microbatches: int = 4, cut: str = DEFAULT_CUT, seed: int = 0, steps: int = 1,
               p2p_timeout: float = 30.0, num_threads: int | None = 1, return_grads: bool = True,
               loss: str = "cross_entropy", train_mode: bool = False, lr: float | None = None) -> dict:
    """One stage (this rank's) of a two-stage ResNet50 pipeline: ``steps`` forward+backward steps.

    Run it on every rank with ``cluster.run(train_step, x, y, schedule=...)``. ``x`` and ``y``
    are a batch of images and labels, or lists of batches that the steps take in turn. By default
    BatchNorm is in eval mode, so cutting the batch into micro-batches does not change the result:
    the loss and gradients equal a local model's (``compare.reference_step``), and no optimizer
    step is taken. ``train_mode=True`` and ``lr`` (an SGD step per shard after every backward) do
    the RPC tutorial's training instead, on fresh shards; ``loss="mse"`` takes one-hot labels.
    ``num_threads`` (default 1: a core per stage, as a GPU per stage would be) is restored after.
    Returns this stage's loss (last stage), gradients, step times, forward/backward timeline and the
    peak bytes of activations kept for backward.
    """
    _check_options(schedule, cut, world_size, steps, num_threads, loss, lr, p2p_timeout)
    if schedule == "1f1b" and num_microbatches < world_size:
        raise ConfigError(f"1F1B needs at least as many micro-batches as stages ({world_size}), got "
                          f"{num_microbatches}: use smaller micro-batches, or GPipe.")
    xs, ys = (list(x), list(y)) if isinstance(x, (list, tuple)) else ([x], [y])
    if not xs or len(xs) != len(ys) or len({tuple(b.shape) for b in xs}) != 1:
        raise ConfigError("give one batch of images and labels, or equally long lists of batches "
                          "of the same shape.")
    microbatch_size = microbatch_size_of(len(xs[0]), num_microbatches)
    examples = stage_example_tensors(cut, microbatch_size, xs[0].shape[-1])
    module = _shard(cut, seed, rank, train_mode, lr)
    optimizer = None if lr is None else torch.optim.SGD(module.parameters(), lr=lr)
    group = _pipeline_group(world_size, p2p_timeout)
    stage, sched = build_schedule(module, rank, world_size, examples, group, schedule, num_microbatches,
                                  LOSSES[loss])
    meter = ActivationMeter(module)
    step_times, losses = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads or threads)
    try:
        for i in range(steps):
            module.zero_grad(set_to_none=True)
            stage.events = []
            meter.reset_peak()
            dist.barrier(group=group)
            start = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
                losses = step_once(stage, sched, xs[i % len(xs)], ys[i % len(ys)])
            if optimizer is not None:
                optimizer.step()
            step_times.append(time.perf_counter() - start)
        dist.barrier(group=group)
    except RuntimeError as exc:
        better = _explain_timeout(exc, stage, schedule, p2p_timeout)
        if better is None:
            raise
        raise better from exc  # the group is left alone: destroying it could block
    finally:
        torch.set_num_threads(threads)
    dist.destroy_process_group(group)
    return {
        "rank": rank, "stage": rank, "schedule": schedule, "num_microbatches": num_microbatches,
        "microbatch_size": microbatch_size, "step_times": step_times,
        "step_start": start, "events": stage.events, "peak_activation_bytes": meter.peak,
        "loss": torch.stack(losses).mean().item() if losses else None,
        "grads": ({name: p.grad.clone() for name, p in module.named_parameters()}
                  if return_grads else None),
    }
