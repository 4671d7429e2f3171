"""The RPC tutorial's experiment (``ppkit pipeline``) with a ``torch.distributed.pipelining`` schedule.

Same work per batch as ``ppkit.pipeline.rpc.sweep`` (random images, one-hot labels, MSE, train-mode
BatchNorm, an SGD step with lr 0.05 on every shard), same rows, timelines and plots; only the
pipeline differs: two ranks of a gloo cluster, one stage each, driven by GPipe or 1F1B.

    with ppkit.Cluster(2, "gloo") as cluster:
        result = run_sweep(cluster, PipelineConfig(batch_size=32, microbatch_sizes=(4, 8)), "1f1b")
"""

from __future__ import annotations

from ppkit.errors import ConfigError
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.pipeline.rpc.sweep import LEARNING_RATE, RunResult, SweepResult, make_batch
from ppkit.pipeline.schedules.compare import run_schedule
from ppkit.pipeline.schedules.stage import NUM_CLASSES, check_schedule
from ppkit.pipeline.schedules.verify import GRAD_RTOL, grad_difference, reference_step

VERIFY_TOLERANCE = GRAD_RTOL  # relative: largest gradient difference / largest gradient


def check_config(config: PipelineConfig, schedule: str) -> PipelineConfig:
    """What a pipelining schedule needs beyond ``config.check()``: equal micro-batches, and for 1F1B
    at least as many micro-batches as stages."""
    check_schedule(schedule)
    config.check()
    if config.num_classes != NUM_CLASSES:
        raise ConfigError(f"the {schedule} stages use ResNet50's {NUM_CLASSES} classes, not "
                          f"{config.num_classes}.")
    for size in config.microbatch_sizes:
        if config.batch_size % size:
            raise ConfigError(
                f"micro-batch size {size} does not divide the batch of {config.batch_size}: the "
                f"{schedule} schedule needs equal micro-batches. Pick sizes that divide "
                f"{config.batch_size}.")
        if schedule == "1f1b" and config.batch_size // size < 2:
            raise ConfigError(
                f"micro-batch size {size} leaves 1 micro-batch, and 1F1B needs at least one per stage "
                "(2): pick a smaller size, or --schedule gpipe.")
    return config


def run_sweep(cluster, config: PipelineConfig, schedule: str, *, progress=None,
              on_result=None) -> SweepResult:
    """``config.num_batches`` training steps at every micro-batch size, on fresh shards each time.

    ``progress(done, total)`` is called after each configuration (its batches run in one job);
    ``on_result(run)`` gets each :class:`ppkit.pipeline.rpc.sweep.RunResult`.
    """
    check_config(config, schedule)
    inputs, labels = zip(*(make_batch(config, i) for i in range(config.num_batches)))
    total = config.num_batches * len(config.microbatch_sizes)
    result = SweepResult(config)
    for n, size in enumerate(config.microbatch_sizes):
        run = run_schedule(cluster, list(inputs), list(labels), schedule,
                           num_microbatches=config.batch_size // size, steps=config.num_batches,
                           cut=config.cut, seed=config.seed, loss="mse", train_mode=config.train_mode,
                           lr=LEARNING_RATE, return_grads=False)
        row = RunResult(size, run.num_microbatches, run.step_times, config.batch_size, run.timeline,
                        run.prediction())
        result.runs.append(row)
        if progress is not None:
            progress((n + 1) * config.num_batches, total)
        if on_result is not None:
            on_result(row)
    return result


def verify_report(cluster, config: PipelineConfig, schedule: str) -> tuple[bool, str]:
    """``verify`` as ``ppkit pipeline --verify`` prints it: (within tolerance?, one line)."""
    worst = verify(cluster, config, schedule)
    ok = worst <= VERIFY_TOLERANCE
    return ok, (f"verify: largest gradient difference from a local torchvision ResNet50 = {worst:.2e} of "
                f"the largest gradient (batch 0, eval mode, same weights, micro-batch sizes "
                f"{' '.join(map(str, config.microbatch_sizes))}): {'OK' if ok else 'TOO LARGE'} "
                f"(tolerance {VERIFY_TOLERANCE:g})")


def verify(cluster, config: PipelineConfig, schedule: str) -> float:
    """Largest gradient difference (relative) between the schedule and a local ResNet50 with the
    same weights, on batch 0 in eval mode, over ``config``'s micro-batch sizes."""
    check_config(config, schedule)
    x, y = make_batch(config, 0)
    reference = reference_step(x, y, config.cut, config.seed, loss="mse")
    worst = 0.0
    for size in config.microbatch_sizes:
        run = run_schedule(cluster, x, y, schedule, num_microbatches=config.batch_size // size,
                           cut=config.cut, seed=config.seed, loss="mse")
        worst = max(worst, grad_difference(run.grads, reference["grads"]))
    return worst
