"""The ResNet50 split as stages of ``torch.distributed.pipelining`` (GPipe, 1F1B), beside RPC; and
the schedules past 1F1B with two stages per rank (Interleaved1F1B, InterleavedZeroBubble,
ZBVZeroBubble, DualPipeV).

    from ppkit.pipeline.schedules import make_batch, run_schedule, reference_step, compare_schedules
    from ppkit.pipeline.schedules import compare_looped, format_looped_table, plot_looped

Importing it (or any module in it) on a torch without ``torch.distributed.pipelining`` (before 2.4)
raises ppkit's ClusterStateError saying so, not an ImportError from deep inside.
"""

from ppkit.compat import require_pipelining

require_pipelining("ppkit.pipeline.schedules (GPipe and 1F1B: notebook 08, ppkit pipeline --schedule gpipe)")

from ppkit.pipeline.schedules.bubble_model import KINDS  # noqa: E402
from ppkit.pipeline.schedules.compare import (  # noqa: E402
    compare_looped,
    compare_schedules,
    rpc_step,
    run_looped,
    run_schedule,
)
from ppkit.pipeline.schedules.looped_report import format_looped_table, plot_looped  # noqa: E402
from ppkit.pipeline.schedules.looped_run import LoopedRun  # noqa: E402
from ppkit.pipeline.schedules.memory import ActivationMeter  # noqa: E402
from ppkit.pipeline.schedules.placement import MULTI_STAGE, SPECS  # noqa: E402
from ppkit.pipeline.schedules.report import format_table, plot_timelines  # noqa: E402
from ppkit.pipeline.schedules.schedule_run import ScheduleRun  # noqa: E402
from ppkit.pipeline.schedules.stage import SCHEDULES, make_batch, train_step  # noqa: E402
from ppkit.pipeline.schedules.verify import grad_difference, reference_step  # noqa: E402

__all__ = [
    "KINDS",
    "MULTI_STAGE",
    "SCHEDULES",
    "SPECS",
    "ActivationMeter",
    "LoopedRun",
    "ScheduleRun",
    "compare_looped",
    "compare_schedules",
    "format_looped_table",
    "format_table",
    "grad_difference",
    "make_batch",
    "plot_looped",
    "plot_timelines",
    "reference_step",
    "rpc_step",
    "run_looped",
    "run_schedule",
    "train_step",
]
