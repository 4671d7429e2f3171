"""Which stages each rank holds, and how many micro-batches each schedule can take.

GPipe and 1F1B put one stage on each rank. The schedules past 1F1B in torch.distributed.pipelining
put ``v = 2`` stages on each rank, so ResNet50 is cut into ``2 x ranks`` stages:

- *looped* placement (Interleaved1F1B, InterleavedZeroBubble): stage ``s`` on rank ``s % ranks``,
  so with 2 ranks rank 0 holds stages 0 and 2, rank 1 holds 1 and 3;
- *V* placement (ZBVZeroBubble, DualPipeV): down the ranks and back up, so rank 0 holds stages 0
  and 3 (the first and the last), rank 1 holds 1 and 2.

Each torch schedule refuses some micro-batch counts when it is built (a ``ValueError`` on every
rank); :func:`check_microbatches` refuses them first, saying which counts work.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppkit.errors import ConfigError
from ppkit.models.resnet import DEFAULT_CUT, check_cuts

FOUR_STAGE_CUTS = ("layer1", "layer2", "layer3")  # stem+layer1 | layer2 | layer3 | layer4+head


@dataclass(frozen=True)
class ScheduleSpec:
    torch_name: str  # the class in torch.distributed.pipelining
    stages_per_rank: int
    placement: str  # "one" (a stage per rank), "loop" or "v"
    splits_backward: bool  # runs the backward as I (input gradient) then W (weight gradient)


SPECS = {
    "gpipe": ScheduleSpec("ScheduleGPipe", 1, "one", False),
    "1f1b": ScheduleSpec("Schedule1F1B", 1, "one", False),
    "interleaved1f1b": ScheduleSpec("ScheduleInterleaved1F1B", 2, "loop", False),
    "interleavedzerobubble": ScheduleSpec("ScheduleInterleavedZeroBubble", 2, "loop", True),
    "zbvzerobubble": ScheduleSpec("ScheduleZBVZeroBubble", 2, "v", True),
    "dualpipev": ScheduleSpec("ScheduleDualPipeV", 2, "v", True),
}
MULTI_STAGE = tuple(name for name, spec in SPECS.items() if spec.stages_per_rank > 1)


def spec_of(schedule: str) -> ScheduleSpec:
    if schedule not in SPECS:
        raise ConfigError(f"unknown schedule {schedule!r}; torch.distributed.pipelining schedules "
                          f"here are {', '.join(SPECS)}.")
    return SPECS[schedule]


def num_stages_of(schedule: str, num_ranks: int) -> int:
    return spec_of(schedule).stages_per_rank * num_ranks


def stage_to_rank(schedule: str, num_ranks: int) -> list[int]:
    """The rank that holds each stage (index = stage)."""
    spec = spec_of(schedule)
    if spec.placement == "v":  # 0, 1, ..., p-1, p-1, ..., 1, 0
        return [*range(num_ranks), *reversed(range(num_ranks))]
    return [s % num_ranks for s in range(spec.stages_per_rank * num_ranks)]


def stages_of_rank(schedule: str, rank: int, num_ranks: int) -> list[int]:
    """The stages ``rank`` holds, lowest first."""
    return [s for s, r in enumerate(stage_to_rank(schedule, num_ranks)) if r == rank]


def stage_cuts(schedule: str, num_ranks: int, cut=None) -> tuple[str, ...]:
    """Where ResNet50 is cut for ``schedule``: ``cut`` (one cut point, or one per stage boundary),
    by default the tutorial's ``layer2`` for two stages and :data:`FOUR_STAGE_CUTS` for four."""
    stages = num_stages_of(schedule, num_ranks)
    if cut is None:
        cut = DEFAULT_CUT if stages == 2 else FOUR_STAGE_CUTS if stages == 4 else None
    if cut is None:
        raise ConfigError(f"{schedule} on {num_ranks} ranks needs {stages} stages; give cut= as "
                          f"{stages - 1} cut points of ResNet50.")
    cuts = check_cuts(cut)
    if len(cuts) != stages - 1:
        raise ConfigError(f"{schedule} on {num_ranks} ranks runs {stages} stages, so it needs "
                          f"{stages - 1} cut point(s), got {list(cuts)}"
                          + (f"; e.g. cut={FOUR_STAGE_CUTS}." if stages == 4 else "."))
    return cuts


def takes_microbatches(schedule: str, num_ranks: int, num_microbatches: int) -> bool:
    """Whether torch 2.14's ``schedule`` accepts ``num_microbatches`` on ``num_ranks`` ranks."""
    m, stages = num_microbatches, num_stages_of(schedule, num_ranks)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        return False
    if schedule == "1f1b":
        return m >= stages
    if schedule == "dualpipev":
        return m >= stages
    if schedule in ("interleaved1f1b", "interleavedzerobubble"):
        return m % max(1, m // num_ranks) == 0  # whole "rounds" of m // ranks micro-batches
    return True


def working_counts(schedule: str, num_ranks: int, upto: int = 16) -> list[int]:
    return [m for m in range(1, upto + 1) if takes_microbatches(schedule, num_ranks, m)]


def check_microbatches(schedule: str, num_ranks: int, num_microbatches) -> int:
    """``num_microbatches`` if ``schedule`` can run it on ``num_ranks`` ranks; else ConfigError
    naming the value, the rule and the counts that work."""
    spec, m = spec_of(schedule), num_microbatches
    if takes_microbatches(schedule, num_ranks, m):
        return m
    stages = num_stages_of(schedule, num_ranks)
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        why = "it must be a whole number of at least 1"
    elif schedule in ("1f1b", "dualpipev"):
        why = (f"it needs at least as many micro-batches as stages ({stages} stages on {num_ranks} ranks)")
    else:
        rounds = max(1, m // num_ranks)
        why = (f"it splits the micro-batches into m // ranks = {m} // {num_ranks} = {rounds} rounds of "
               f"equal size, and {m} is not a multiple of {rounds}")
    counts = ", ".join(map(str, working_counts(schedule, num_ranks)))
    raise ConfigError(f"{spec.torch_name} cannot take num_microbatches={m!r} on {num_ranks} ranks: {why}. "
                      f"Counts that work here: {counts}, ... (and the batch size must be a multiple of it).")
