"""A schedule's plan (each rank's order of work) and its bubble model: that plan run as early as the
data allows, every piece of work taking a given time and sending costing nothing.

Every torch.distributed.pipelining schedule computes, on every rank, the plan of *all* ranks
(``schedule.pipeline_order``: rank -> actions). :func:`plan_of` reads it as :class:`Op` s:

- ``F``: a stage's forward of one micro-batch;
- ``B``: its whole backward;
- ``I`` and ``W``: the zero-bubble split of that backward into the gradient for the stage's input
  (``I``, which the previous stage waits for) and for its weights (``W``, which nobody waits for, so
  a schedule can put it into what would have been a bubble).

Dependencies (:func:`simulate`): ``F`` of stage ``s`` needs ``F`` of ``s - 1`` (same micro-batch);
``B`` or ``I`` of ``s`` needs ``B`` or ``I`` of ``s + 1`` (the last stage: its own ``F``); ``W``
needs the ``I`` of the same stage and micro-batch. A rank does its ops one at a time, in plan order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppkit.errors import ConfigError

KINDS = ("F", "B", "I", "W")
KIND_NAMES = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weights)"}
_TORCH_KINDS = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


@dataclass(frozen=True)
class Op:
    stage: int
    kind: str  # F, B, I or W
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass(frozen=True)
class Work:
    """An op that ran (or would run, in the bubble model) on ``rank`` from ``start`` to ``end`` s."""

    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def plan_of(schedule) -> dict[int, list[Op]]:
    """Rank -> its compute ops in order, from a torch schedule's ``pipeline_order`` (idle slots,
    gradient reductions and sends left out; DualPipeV's "overlapped" forward+backward pairs are
    two ops, in the order torch runs them)."""
    order = getattr(schedule, "pipeline_order", None)
    if not order:
        raise ConfigError(f"{type(schedule).__name__} has no pipeline_order to read (torch 2.14 has one "
                          "on every schedule).")
    plan = {}
    for rank, actions in order.items():
        ops = []
        for action in actions:
            subs = action.sub_actions if action is not None and action.sub_actions else [action]
            for sub in subs:
                kind = None if sub is None else _TORCH_KINDS.get(sub.computation_type.name)
                if kind is not None:
                    ops.append(Op(sub.stage_index, kind, sub.microbatch_index))
        plan[rank] = ops
    return plan


def _needs(op: Op, num_stages: int) -> tuple | None:
    if op.kind == "F":
        return (op.stage - 1, "F", op.microbatch) if op.stage > 0 else None
    if op.kind == "W":
        return (op.stage, "I", op.microbatch)
    if op.stage == num_stages - 1:
        return (op.stage, "F", op.microbatch)
    return (op.stage + 1, "BI", op.microbatch)  # the next stage's B or I, whichever it ran


def simulate(plan: dict[int, list[Op]], durations) -> list[Work]:
    """Run every rank's ops in plan order, each as soon as its rank is free and its input is there.

    ``durations(op)`` (or a dict ``(stage, kind) -> seconds``) gives each op's time. Raises
    ConfigError if the plan waits on itself (a deadlock).
    """
    cost = durations if callable(durations) else (lambda op: durations[(op.stage, op.kind)])
    num_stages = 1 + max(op.stage for ops in plan.values() for op in ops)
    done: dict[tuple, float] = {}
    clock = dict.fromkeys(plan, 0.0)
    position = dict.fromkeys(plan, 0)
    works: list[Work] = []
    while any(position[r] < len(plan[r]) for r in plan):
        progressed = False
        for rank, ops in plan.items():
            while position[rank] < len(ops):
                op = ops[position[rank]]
                need = _needs(op, num_stages)
                if need is not None and need[1] == "BI":
                    need = next(((need[0], k, need[2]) for k in "BI" if (need[0], k, need[2]) in done), need)
                if need is not None and need not in done:
                    break
                start = max(clock[rank], done[need] if need is not None else 0.0)
                clock[rank] = done[(op.stage, op.kind, op.microbatch)] = start + cost(op)
                works.append(Work(rank, op.stage, op.kind, op.microbatch, start, clock[rank]))
                position[rank] += 1
                progressed = True
        if not progressed:
            stuck = {r: str(plan[r][position[r]]) for r in plan if position[r] < len(plan[r])}
            raise ConfigError(f"this plan waits on itself (a deadlock): the next op of each rank is {stuck}.")
    return sorted(works, key=lambda w: (w.rank, w.start))


def span(works: list[Work]) -> float:
    return max(w.end for w in works) - min(w.start for w in works) if works else 0.0


def busy(works: list[Work], rank: int) -> float:
    """Seconds ``rank`` computed (its works never overlap: one rank runs one op at a time)."""
    return sum(w.duration for w in works if w.rank == rank)


def idle_share(works: list[Work], num_ranks: int) -> float:
    """The share of ranks x (first start to last end) in which a rank computed nothing: the bubble."""
    total = span(works) * num_ranks
    return 1.0 - sum(busy(works, r) for r in range(num_ranks)) / total if total > 0 else 0.0
