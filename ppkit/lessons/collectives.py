"""Lesson 2, collectives: run each one on a real cluster, model it in plain Python, draw both.

``run_collective(rank, world_size, op, ...)`` runs one collective on every rank (through
``cluster.run``) and returns each rank's tensor before and after. ``reference(op, world_size, ...)``
computes the same thing without any processes: it is what the explorer widget draws, and the tests
and notebook 02 check it against the real ``torch.distributed`` results.

A rank's state is a flat list of numbers (lists of tensors, such as all_gather's output, are
concatenated; ``chunk`` says how many numbers one piece holds), or ``None`` where the rank has no
such tensor (gather's output on ranks other than the root).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError
from ppkit.lessons.timeline import Timeline

OPS = ("broadcast", "scatter", "gather", "all_gather", "reduce", "all_reduce", "reduce_scatter",
       "all_to_all", "barrier")
REDUCE_OPS = ("sum", "product", "min", "max", "avg")
KINDS = ("seed", "ones", "rank + 1", "distinct")
ROOT = 0
REDUCING = ("reduce", "all_reduce", "reduce_scatter")

DESCRIPTIONS = {
    "broadcast": "broadcast(src=0): rank 0's tensor is copied to every rank.",
    "scatter": "scatter(src=0): rank 0 holds one piece per rank; rank r receives piece r.",
    "gather": "gather(dst=0): every rank's tensor is collected, in rank order, on rank 0 only.",
    "all_gather": "all_gather: every rank ends with every rank's tensor, in rank order.",
    "reduce": "reduce(dst=0): the tensors are combined element by element; only rank 0's result is "
              "defined (gloo leaves partial results in the other ranks' buffers: do not read them).",
    "all_reduce": "all_reduce: the tensors are combined element by element and every rank gets the "
                  "result.",
    "reduce_scatter": "reduce_scatter: every rank's tensor is cut into world_size pieces; piece r of "
                      "every rank is combined, and rank r gets that combination.",
    "all_to_all": "all_to_all: rank r sends its piece j to rank j, and receives piece r of every rank "
                  "(a transpose of the pieces).",
    "barrier": "barrier: no data moves; every rank waits until all ranks have arrived.",
}


def _check(op: str, kind: str, reduce_op: str, world_size: int, numel: int) -> None:
    if op not in OPS:
        raise ConfigError(f"unknown collective {op!r}; choose one of {', '.join(OPS)}.")
    if kind not in KINDS:
        raise ConfigError(f"unknown tensor kind {kind!r}; choose one of {', '.join(KINDS)}.")
    if reduce_op not in REDUCE_OPS:
        raise ConfigError(f"unknown reduce op {reduce_op!r}; choose one of {', '.join(REDUCE_OPS)}.")
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size must be a whole number >= 1, got {world_size!r}.")
    if not isinstance(numel, int) or numel < 1:
        raise ConfigError(f"numel (numbers per piece) must be a whole number >= 1, got {numel!r}.")


def _value(op: str, kind: str, rank: int, i: int, chunk: int) -> float:
    if kind == "seed":  # the inputs of the article's examples
        if op == "broadcast":
            return 2.0 if rank == ROOT else 1.0
        if op == "scatter":
            return float(i // chunk + 1)  # rank 0 holds [1, 2, 3, 4]
        if op == "all_to_all":
            kind = "distinct"
        else:
            return 1.0
    if kind == "ones":
        return 1.0
    if kind == "rank + 1":
        return float(rank + 1)
    return float(10 * rank + i)


def make_input(op: str, kind: str, rank: int, world_size: int, numel: int = 1) -> list[float] | None:
    """The numbers rank ``rank`` passes in (``None`` if it passes none, like scatter's non-roots)."""
    if op == "scatter" and rank != ROOT:
        return None
    pieces = world_size if op in ("scatter", "reduce_scatter", "all_to_all") else 1
    return [_value(op, kind, rank, i, numel) for i in range(pieces * numel)]


def _torch_op(reduce_op: str):
    return getattr(dist.ReduceOp, reduce_op.upper())


def run_collective(rank, world_size, op, kind="seed", reduce_op="sum", numel=1) -> dict:
    """Run ``op`` on this rank (call it through ``cluster.run``); return its state before and after."""
    _check(op, kind, reduce_op, world_size, numel)
    before = make_input(op, kind, rank, world_size, numel)
    t = torch.tensor(before, dtype=torch.float64) if before is not None else None
    after, defined = None, True
    if op == "broadcast":
        dist.broadcast(t, src=ROOT)
        after = t
    elif op == "scatter":
        out = torch.zeros(numel, dtype=torch.float64)
        dist.scatter(out, scatter_list=list(t.split(numel)) if rank == ROOT else None, src=ROOT)
        after = out
    elif op == "gather":
        outs = [torch.zeros(numel, dtype=torch.float64) for _ in range(world_size)] if rank == ROOT else None
        dist.gather(t, gather_list=outs, dst=ROOT)
        after = torch.cat(outs) if rank == ROOT else None
    elif op == "all_gather":
        outs = [torch.zeros(numel, dtype=torch.float64) for _ in range(world_size)]
        dist.all_gather(outs, t)
        after = torch.cat(outs)
    elif op == "reduce":
        dist.reduce(t, dst=ROOT, op=_torch_op(reduce_op))
        after, defined = t, rank == ROOT
    elif op == "all_reduce":
        dist.all_reduce(t, op=_torch_op(reduce_op))
        after = t
    elif op == "reduce_scatter":
        out = torch.zeros(numel, dtype=torch.float64)
        dist.reduce_scatter(out, list(t.split(numel)), op=_torch_op(reduce_op))
        after = out
    elif op == "all_to_all":
        outs = [torch.zeros(numel, dtype=torch.float64) for _ in range(world_size)]
        dist.all_to_all(outs, list(t.split(numel)))
        after = torch.cat(outs)
    else:  # barrier
        dist.barrier()
        after = t
    return {"op": op, "rank": rank, "before": before, "chunk": numel, "defined": defined,
            "after": after.tolist() if after is not None else None}


def run_many(rank, world_size, cases) -> list[dict]:
    """Run several ``(op, kind, reduce_op, numel)`` cases in one job (one round trip)."""
    return [run_collective(rank, world_size, *case) for case in cases]


def _combine(values: list[float], reduce_op: str) -> float:
    if reduce_op == "sum":
        return float(sum(values))
    if reduce_op == "avg":
        return float(sum(values)) / len(values)
    if reduce_op == "product":
        result = 1.0
        for v in values:
            result *= v
        return result
    return float(min(values) if reduce_op == "min" else max(values))


def reference(op, world_size, kind="seed", reduce_op="sum", numel=1) -> list[dict]:
    """What ``run_collective`` gives on each rank, computed in plain Python (no processes).

    Where a result is undefined (reduce on ranks other than the root), ``after`` is ``None`` and
    ``defined`` is False.
    """
    _check(op, kind, reduce_op, world_size, numel)
    ins = [make_input(op, kind, r, world_size, numel) for r in range(world_size)]

    def piece(values, j):
        return values[j * numel:(j + 1) * numel]

    def combined(vectors):
        return [_combine([v[i] for v in vectors], reduce_op) for i in range(len(vectors[0]))]

    states = []
    for r in range(world_size):
        defined, after = True, None
        if op == "broadcast":
            after = list(ins[ROOT])
        elif op == "scatter":
            after = piece(ins[ROOT], r)
        elif op == "gather":
            after = [x for v in ins for x in v] if r == ROOT else None
        elif op == "all_gather":
            after = [x for v in ins for x in v]
        elif op == "reduce":
            defined = r == ROOT
            after = combined(ins) if defined else None
        elif op == "all_reduce":
            after = combined(ins)
        elif op == "reduce_scatter":
            after = combined([piece(v, r) for v in ins])
        elif op == "all_to_all":
            after = [x for v in ins for x in piece(v, r)]
        else:
            after = list(ins[r])
        states.append({"op": op, "rank": r, "before": ins[r], "after": after, "chunk": numel,
                       "defined": defined})
    return states


def after_values(states) -> list:
    """Each rank's result, ``None`` where the rank has none or it is undefined."""
    return [s["after"] if s["defined"] else None for s in states]


def compare(real, expected, tol: float = 1e-9) -> list[str]:
    """Differences between two lists of states (e.g. ``run_collective`` vs ``reference``)."""
    problems = []
    for got, want in zip(real, expected):
        if not want["defined"]:
            continue
        if (got["after"] is None) != (want["after"] is None) or (
                got["after"] is not None and (len(got["after"]) != len(want["after"]) or any(
                    abs(a - b) > tol * max(1.0, abs(b)) for a, b in zip(got["after"], want["after"])))):
            problems.append(f"{got['op']}: rank {got['rank']} has {got['after']}, "
                            f"the model says {want['after']}")
    return problems


def barrier_demo(rank, world_size, stagger_s: float = 0.1):
    """Rank r works ``r * stagger_s`` seconds, then enters a barrier. Returns the spans."""
    tl = Timeline(rank)
    dist.barrier()
    with tl.span("work", "compute", phase="barrier"):
        time.sleep(rank * stagger_s)
    with tl.span("barrier", "comm", phase="barrier"):
        dist.barrier()
    return tl.spans


def plot_states(states, title: str | None = None):
    """Every rank's numbers before and after, as two grids (rows are ranks). Returns a Figure."""
    import math

    import numpy as np
    from matplotlib.figure import Figure

    n = len(states)
    rows = {"before": [s["before"] for s in states], "after": [s["after"] for s in states]}
    width = max(max((len(v) for v in vals if v), default=1) for vals in rows.values())
    found = [x for vals in rows.values() for v in vals if v for x in v]
    low, high = (min(found), max(found)) if found else (0.0, 1.0)
    fig = Figure(figsize=(min(15.0, 2.2 + 1.1 * width), 0.8 + 0.42 * n))
    fontsize = 9 if width <= 12 else 7
    axes = fig.subplots(1, 2)
    op = states[0]["op"] if states else ""
    for ax, (name, vals) in zip(axes, rows.items()):
        grid = np.full((n, width), np.nan)
        for r, v in enumerate(vals):
            if v and (name == "before" or states[r]["defined"]):  # undefined cells stay blank
                grid[r, :len(v)] = v
        ax.imshow(grid, cmap="YlGnBu", vmin=low, vmax=high if high > low else low + 1, aspect="auto")
        for r, v in enumerate(vals):
            undefined = name == "after" and not states[r]["defined"]
            if not v:
                ax.text((width - 1) / 2, r, "(no tensor)", ha="center", va="center", color="grey",
                        fontsize=8)
                continue
            for i, x in enumerate(v):
                text = f"{x:g}" if math.isfinite(x) and abs(x) < 1e6 else f"{x:.2e}"
                shade = (x - low) / (high - low) if high > low else 0.0
                ax.text(i, r, text + ("?" if undefined else ""), ha="center", va="center", fontsize=fontsize,
                        color="dimgrey" if undefined else ("white" if shade > 0.6 else "black"),
                        style="italic" if undefined else "normal")
            if undefined:
                ax.add_patch(_hatch(len(v), r))
            chunk = states[r]["chunk"]
            for edge in range(chunk, len(v), chunk):
                ax.plot([edge - 0.5] * 2, [r - 0.5, r + 0.5], color="black", linewidth=2)
        ax.set_xticks([])
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)])
        ax.set_title(name if name == "before" else f"after {op}", fontsize=10)
        for r in range(1, n):
            ax.axhline(r - 0.5, color="white", linewidth=2)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def _hatch(length: int, row: int):
    from matplotlib.patches import Rectangle

    return Rectangle((-0.5, row - 0.5), length, 1, fill=False, hatch="//", edgecolor="grey",
                     linewidth=0)
