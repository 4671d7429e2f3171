"""The ResNet50 split as stages of ``torch.distributed.pipelining`` (GPipe, 1F1B), beside RPC.

    from ppkit.pipelining import make_batch, run_schedule, reference_step, compare_schedules
"""

from ppkit.pipelining.compare import (
    KINDS,
    ScheduleRun,
    compare_schedules,
    format_table,
    grad_difference,
    plot_timelines,
    reference_step,
    rpc_step,
    run_schedule,
)
from ppkit.pipelining.memory import ActivationMeter
from ppkit.pipelining.stage import SCHEDULES, make_batch, train_step

__all__ = [
    "KINDS",
    "SCHEDULES",
    "ActivationMeter",
    "ScheduleRun",
    "compare_schedules",
    "format_table",
    "grad_difference",
    "make_batch",
    "plot_timelines",
    "reference_step",
    "rpc_step",
    "run_schedule",
    "train_step",
]
