"""The bubble model of any schedule: each stage's order of work, run as early as the data allows.

``ppkit.pipeline.bubble`` models GPipe's order only; 1F1B reorders the work, so the ideal
timeline here is simulated from each stage's order instead of a formula. Fed the measured time
per micro-batch of each stage, it is what the step would take if sending and waiting cost nothing.
"""

from __future__ import annotations

from ppkit.errors import ConfigError
from ppkit.pipeline.schedules.stage import SCHEDULES
from ppkit.pipeline.timeline import Event

KINDS = ("rpc", *SCHEDULES)  # every schedule a comparison can run
PHASE = {"F": "forward", "B": "backward"}


def check_kind(schedule: str) -> str:
    if schedule not in KINDS:
        raise ConfigError(f"unknown schedule {schedule!r}; choose from {', '.join(KINDS)}.")
    return schedule


def schedule_orders(schedule: str, num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """Each stage's order of work, ``("F" or "B", micro-batch)``.

    GPipe (and the RPC pipeline, whose loss needs every micro-batch's output): all forwards, then all
    backwards. 1F1B: stage ``s`` runs ``min(m, S - s)`` forwards, then alternates one backward and
    one forward, then the remaining backwards.
    """
    check_kind(schedule)
    m = num_microbatches
    orders = []
    for s in range(num_stages):
        if schedule == "1f1b":
            warmup = min(m, num_stages - s)
            order = [("F", i) for i in range(warmup)]
            for i in range(m):
                order.append(("B", i))
                if warmup + i < m:
                    order.append(("F", warmup + i))
        else:
            order = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        orders.append(order)
    return orders


def ideal_timeline(orders, forward_times, backward_times) -> list[Event]:
    """Run every stage's ``orders`` as early as the data allows, each forward taking
    ``forward_times[stage]`` and each backward ``backward_times[stage]``, sending costing nothing.

    A forward needs the previous stage's forward of the same micro-batch; a backward needs the next
    stage's backward of it (the last stage: its own forward).
    """
    num_stages = len(orders)
    done: dict[tuple[int, str, int], float] = {}
    clock, position, events = [0.0] * num_stages, [0] * num_stages, []
    while any(position[s] < len(orders[s]) for s in range(num_stages)):
        progressed = False
        for s in range(num_stages):
            while position[s] < len(orders[s]):
                kind, mb = orders[s][position[s]]
                needs = ((s - 1, "F", mb) if kind == "F" and s > 0 else
                         (s + 1, "B", mb) if kind == "B" and s < num_stages - 1 else
                         (s, "F", mb) if kind == "B" else None)
                if needs is not None and needs not in done:
                    break
                start = max(clock[s], done.get(needs, 0.0))
                clock[s] = done[(s, kind, mb)] = start + (forward_times if kind == "F" else backward_times)[s]
                events.append(Event(s, mb, PHASE[kind], start, clock[s]))
                position[s] += 1
                progressed = True
        if not progressed:
            raise ConfigError("these stage orders wait on each other forever (a deadlock).")
    return sorted(events, key=lambda e: (e.stage, e.start))
