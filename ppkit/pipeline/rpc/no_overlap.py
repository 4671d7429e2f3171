"""The no-overlap reference at any micro-batch size: the same micro-batches, one after the other.

Cutting a batch into micro-batches of ``s`` images changes two things at once: the stages overlap,
and every image now goes through the stages in a smaller micro-batch, which may cost more or less
per image (small kernels are less efficient; a large batch's activations do not fit in the caches).
To tell the two apart, :func:`train_no_overlap` runs the very same micro-batches with nothing
overlapping: micro-batch ``i`` goes forward through every stage, gets its share of the loss and goes
backward (in a distributed-autograd context of its own) before micro-batch ``i + 1`` starts; each
stage adds up its gradients, and one optimizer step follows. Same micro-batches, same train-mode
BatchNorm statistics and same update as the pipelined step at that size; only the overlap is gone.

    pipelined = train_batches(model, optimizer, config, microbatch_size=4)
    alone = train_no_overlap(model, optimizer, config, microbatch_size=4)
    alone.seconds_per_batch / pipelined.seconds_per_batch   # the gain from overlap alone
    overlap_bound(alone, rest_seconds)                       # what overlap could give at best

:func:`solo_seconds_per_image` times one stage alone at several micro-batch sizes, in this process:
what a micro-batch's size does to the cost of an image, with no pipeline around it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn

from ppkit.errors import ConfigError
from ppkit.pipeline.bubble import predict_from_timeline
from ppkit.pipeline.rpc.config import check_microbatch_size, num_microbatches
from ppkit.pipeline.rpc.sweep import RunResult, make_batch
from ppkit.pipeline.timeline import Timeline


def train_no_overlap(model, optimizer, config, microbatch_size: int) -> RunResult:
    """``config.num_batches`` training steps at ``microbatch_size``, one micro-batch at a time.

    The result's timeline numbers the micro-batches in the order they ran, and its ``prediction``
    is the bubble model of these solo stage times: what pipelining them could reach.
    """
    check_microbatch_size(microbatch_size, config.batch_size)
    loss_fn = nn.MSELoss()
    count = num_microbatches(config.batch_size, microbatch_size)
    seconds, timeline = [], None
    model.drain_events()  # drop anything recorded before this run
    try:
        for index in range(config.num_batches):
            inputs, labels = make_batch(config, index)
            start = time.time()
            for chunk, target in zip(inputs.split(microbatch_size), labels.split(microbatch_size)):
                model.microbatch_size = len(chunk)  # the whole chunk is one micro-batch
                with dist_autograd.context() as context_id:
                    # each chunk's share of the batch's mean loss, so the gradients add up to the batch's
                    loss = loss_fn(model(chunk), target) * (len(chunk) / len(inputs))
                    dist_autograd.backward(context_id, [loss])
                    optimizer.accumulate(context_id)
            backward_done = time.time()
            optimizer.step(None)
            seconds.append(time.time() - start)
            raw = model.drain_events()
            if index == config.num_batches - 1:
                first = min((event[1] for event in raw), default=0)  # one model call per micro-batch
                raw = [(stage, 0, step - first, phase, t0, t1) for stage, step, _, phase, t0, t1 in raw]
                timeline = Timeline.from_raw(raw, model.stage_labels(), count, origin=start,
                                             marks={"backward done": backward_done,
                                                    "optimizer done": start + seconds[-1]})
    finally:
        model.microbatch_size = microbatch_size
    prediction = predict_from_timeline(timeline) if timeline.events else None
    return RunResult(microbatch_size, count, seconds, config.batch_size, timeline, prediction)


def overlap_bound(run: RunResult, rest_seconds: float) -> float:
    """The most overlap could speed up ``run`` (a :func:`train_no_overlap` result): its step time over
    the ideal pipeline of the same stage times (GPipe, sends free) plus ``rest_seconds``, what a
    step spends outside the stages when the batch is not cut (loss, optimizer, one round of messages:
    ``Reference.fixed_seconds``). Run one at a time, every micro-batch also waits for its own
    messages and loss; in a pipeline those overlap with the other micro-batches' compute."""
    if run.prediction is None:
        return 1.0
    return run.seconds_per_batch / (max(0.0, rest_seconds) + run.prediction.total)


def solo_seconds_per_image(shard: nn.Module, input_shape, sizes, *, backward: bool = True,
                           num_threads: int = 1, repeats: int = 1) -> dict[int, float]:
    """Seconds per image of ``shard`` alone (forward, and backward unless ``backward=False``) for
    micro-batches of each size in ``sizes``; ``input_shape``: one input without the batch dimension.

    Runs in this process on ``num_threads`` threads (restored after), the fastest of ``repeats``.
    """
    sizes = list(sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ConfigError(f"sizes must be whole numbers of images >= 1, got {sizes!r}.")
    threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        result = {}
        for size in sizes:
            x = torch.randn(size, *input_shape)
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                out = shard(x)  # autograd records, and keeps the activations, as in training
                if backward:
                    out.sum().backward()
                best = min(best, time.perf_counter() - start)
                del out
            shard.zero_grad(set_to_none=True)
            result[size] = best / size
        return result
    finally:
        torch.set_num_threads(threads)
