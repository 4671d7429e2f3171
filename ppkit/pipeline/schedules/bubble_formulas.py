"""Each schedule's bubble for equal stages, as its paper states it, and where it comes from.

Notation: ``p`` ranks, ``m`` micro-batches, ``v`` stages per rank. ``F`` and ``B = I + W`` are one
rank's forward and backward time per micro-batch over all its stages (a stage of a two-stage rank
takes ``F / v``); ``I`` is the part of the backward that computes the gradient for the stage's input,
``W`` the part for its weights. The *bubble* is a rank's idle time in one step; the step is
``m (F + B) + bubble``, so the idle share is ``bubble / (m (F + B) + bubble)``.

The zero-bubble rows are checked here against torch's own plans (``torch_plans``), simulated with
equal stages and free sends (``tests/test_pipelining_schedules.py``, ``p`` = 2 to 4): the papers'
schedules and torch's are not always the same, and the table says where they differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ppkit.pipeline.schedules import placement
from ppkit.pipeline.schedules.plan import Op, idle_share, simulate


@dataclass(frozen=True)
class Formula:
    text: str  # the bubble per rank
    assumes: str
    source: str
    bubble: Callable[[int, int, float, float, float], float]  # (p, v, F, I, W) -> seconds


FORMULAS = {
    "gpipe": Formula(
        "(p-1)(F+B)", "equal stages",
        "GPipe, Huang et al. 2019 (arXiv:1811.06965): idle share (p-1)/(m+p-1)",
        lambda p, v, f, i, w: (p - 1) * (f + i + w)),
    "1f1b": Formula(
        "(p-1)(F+B)", "equal stages",
        "Narayanan et al. 2021 (arXiv:2104.04473) §2.2.1: bubble / work = (p-1)/m, as GPipe's",
        lambda p, v, f, i, w: (p - 1) * (f + i + w)),
    "interleaved1f1b": Formula(
        "(p-1)(F+B)/v", "equal stages, m >= p",
        "Narayanan et al. 2021 (arXiv:2104.04473) §2.2.2: bubble / work = (1/v)(p-1)/m",
        lambda p, v, f, i, w: (p - 1) * (f + i + w) / v),
    "interleavedzerobubble": Formula(
        "(p-1)(F+I-W)/v", "equal stages, W <= F, m >= p",
        "Qi et al. 2024 (arXiv:2401.10241) ZB-H1: (p-1)(F+I-W) for v = 1 (their B is our I); "
        "divided by v as interleaving divides 1F1B's: ppkit's reading, which torch's plan matches",
        lambda p, v, f, i, w: (p - 1) * (f + i - w) / v),
    "zbvzerobubble": Formula(
        "(p-1)F/v", "equal stages, F = I = W, m >= 2p-1",
        "Qi et al. 2024 §6 (ZB-V) report 'zero bubble' for F = I = W at 1F1B's activation memory; "
        "torch's plan, simulated, keeps the second rank's wait for the first forward: (p-1)F/v",
        lambda p, v, f, i, w: (p - 1) * f / v),
    "dualpipev": Formula(
        "(p-1)F/v", "equal stages, F = I = W, m >= 2p",
        "DeepSeek-V3 report (arXiv:2412.19437) Table 2 gives DualPipe's (PP/2-1)(F&B+B-3W) for chunks "
        "with overlapped F&B; on CPU torch runs the pair one after the other. (p-1)F/v: torch's plan, "
        "simulated",
        lambda p, v, f, i, w: (p - 1) * f / v),
}


def formula_bubble(schedule: str, num_ranks: int, f: float = 1.0, i: float = 1.0, w: float = 1.0) -> float:
    """The formula's bubble (idle seconds per rank) for one rank's times per micro-batch: forward
    ``f``, input-gradient backward ``i``, weight-gradient backward ``w``."""
    v = placement.spec_of(schedule).stages_per_rank
    return FORMULAS[schedule].bubble(num_ranks, v, f, i, w)


def formula_idle_share(schedule: str, num_ranks: int, num_microbatches: int, f: float = 1.0,
                       i: float = 1.0, w: float = 1.0) -> float:
    bubble = formula_bubble(schedule, num_ranks, f, i, w)
    return bubble / (num_microbatches * (f + i + w) + bubble)


def equal_stage_times(schedule: str, f: float = 1.0, i: float = 1.0, w: float = 1.0):
    """Seconds of each op when every rank's work per micro-batch is ``f``, ``i``, ``w``, split
    evenly over its stages (a whole backward ``B`` takes ``i + w``)."""
    v = placement.spec_of(schedule).stages_per_rank
    per_kind = {"F": f / v, "B": (i + w) / v, "I": i / v, "W": w / v}
    return lambda op: per_kind[op.kind]


def plan_idle_share(schedule: str, plan: dict[int, list[Op]], f: float = 1.0, i: float = 1.0,
                    w: float = 1.0) -> float:
    """The idle share of ``plan`` run with equal stages and free sends."""
    return idle_share(simulate(plan, equal_stage_times(schedule, f, i, w)), len(plan))
