"""Notebook 02's debugging exercise: the mean loss over ranks that hold different numbers of losses.

    check_mean_loss(fn)    every rank returns the mean of every rank's losses, some ranks holding none

The ranks run in process groups that check every collective as ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does,
so the two classic mistakes end in a named error at once rather than a hang: a rank that skips a
collective (it had no losses), and ranks that pass tensors of different shapes (their lists of losses).
A wrong number is named too: the mean of the ranks' means, a rank's own mean, the sum, nan.
"""

from __future__ import annotations

import math
import re

import torch
import torch.distributed as dist

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks

WORLD_SIZES = (2, 3, 4)
MISMATCH = "Detected mismatch between collectives"  # what a DETAIL group raises on every rank
_FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+,?\s*"
                          r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\], TensorDtypes=(\w+))?")


def loss_counts(world_size: int) -> list[list[int]]:
    """How many losses each rank holds, case by case: the same on every rank, uneven, one rank with none."""
    return [[2] * world_size,
            [world_size + 1 - r for r in range(world_size)],
            [r + 1 for r in range(world_size - 1)] + [0]]


def rank_losses(rank: int, count: int) -> list[float]:
    """Rank ``rank``'s losses: eighths, so that every sum and mean here is exact."""
    return [(8 * rank + j + 1) / 8 for j in range(count)]


def _as_number(value) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _mean_loss_job(rank, k, fn):
    """Each case: the learner's function, then a barrier that every rank reaches only if all made the same
    collective calls. Only the DETAIL check's mismatch is kept here; any other error reaches the checker."""
    out = []
    for case in loss_counts(k):
        where = "inside"
        try:
            got = fn(rank, k, rank_losses(rank, case[rank]))
            where = "after"
            dist.barrier()
        except NotImplementedError:
            return NOT_WRITTEN
        except RuntimeError as err:
            if MISMATCH not in str(err):
                raise
            out.append(("mismatch", where, str(err)))
            break  # the group's collectives are out of step from here on
        out.append(("returned", _as_number(got), f"{type(got).__name__} {got!r:.60}"))
    return out


def check_mean_loss(fn, world_sizes=WORLD_SIZES, timeout: float = 10, cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(rank, world_size, losses) -> float``: every rank returns the mean of all ranks' losses
    (each rank passes its own list, possibly empty), in groups that catch mismatched collectives."""
    check_callable(fn, "fn(rank, world_size, losses)")

    def problems(k, results):
        for i, counts in enumerate(loss_counts(k)):
            outcomes = {r: results[r][i] for r in range(k) if i < len(results[r])}
            if not outcomes:
                return
            label = f"world_size {k}, losses per rank {counts}"
            if any(o[0] == "mismatch" for o in outcomes.values()):
                yield _explain_mismatch(label, counts, outcomes)
                return
            yield from _wrong_values(label, counts, outcomes)

    return check_on_ranks(CheckReport("mean loss"), fn, world_sizes, timeout, cluster,
                          lambda k: [f"world_size {k}, losses per rank {c}" for c in loss_counts(k)],
                          _mean_loss_job, (fn,), problems, detail=True)


def _explain_mismatch(label: str, counts: list[int], outcomes: dict) -> str:
    """One sentence from the DETAIL check's messages: which rank skipped a collective, or how the ranks'
    calls differ (shapes, dtypes, operations). ``outcomes``: rank -> ("mismatch", where, message) or a result."""
    prints = {}
    for o in outcomes.values():
        if o[0] == "mismatch":
            for rank, op, shape, dtype in _FINGERPRINT.findall(o[2]):
                prints.setdefault(int(rank), (op, shape, dtype))
    after = sorted(r for r, o in outcomes.items() if o[0] == "mismatch" and o[1] == "after")
    inside = sorted(r for r, o in outcomes.items() if o[0] == "mismatch" and o[1] == "inside")
    held = ", ".join(f"rank {r}: {counts[r]}" for r in (after or inside))
    if after and inside:
        ops = sorted({prints[r][0] for r in inside if r in prints}) or ["a collective"]
        return (f"{label}: rank(s) {after} returned from the function while rank(s) {inside} were still in "
                f"{'/'.join(ops)} ({held} losses): every rank must make the same collective calls, a rank with no "
                "losses too (it adds zeros). TORCH_DISTRIBUTED_DEBUG=DETAIL caught it; without it this is a hang")
    shapes = {r: prints[r][1] for r in sorted(prints) if prints[r][2]}
    dtypes = {r: prints[r][2] for r in sorted(prints) if prints[r][2]}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"rank {r} [{s}]" for r, s in shapes.items())
        return (f"{label}: the ranks called {prints[min(shapes)][0]} with tensors of different shapes ({listed}): "
                "each rank passed its own list of losses. Every rank must pass the same shape, whatever its number "
                "of losses: reduce a fixed-size summary (the sum and the count). TORCH_DISTRIBUTED_DEBUG=DETAIL "
                "caught it; without it this is a hang")
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"rank {r} {d}" for r, d in dtypes.items())
        why = ("sum([]) is the int 0, so a rank with no losses made an integer tensor. "
               if any(counts[r] == 0 and d in ("Long", "Int") for r, d in dtypes.items()) else "")
        return (f"{label}: the ranks called {prints[min(dtypes)][0]} with tensors of different dtypes ({listed}): "
                f"{why}Give the tensor its dtype on every rank: torch.tensor([...], dtype=torch.float64)")
    ops = ", ".join(f"rank {r} {p[0]}" for r, p in sorted(prints.items()))
    return (f"{label}: the ranks called different collectives at the same point ({ops or 'see the error'}): every "
            "rank must make the same collective calls in the same order")


def _wrong_values(label: str, counts: list[int], outcomes: dict):
    losses = {r: rank_losses(r, c) for r, c in enumerate(counts)}
    every = [x for r in sorted(losses) for x in losses[r]]
    want = sum(every) / len(every)
    own_means = [sum(v) / len(v) for v in losses.values() if v]
    known = {"the mean of the ranks' own means": sum(own_means) / len(own_means),
             "the mean of the ranks' own means, 0 for a rank with none": sum(own_means) / len(counts),
             "the sum of every loss, not divided by their number": sum(every),
             f"the sum divided by world_size ({len(counts)}), not by the number of losses ({len(every)})":
                 sum(every) / len(counts)}
    said: dict[str, tuple[list[int], str]] = {}  # kind of mistake -> (ranks, the first rank's sentence)
    for rank, (_, got, shown) in sorted(outcomes.items()):
        if got is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9):
            continue
        kind, text = _name_wrong_value(got, shown, want, losses[rank], known)
        said.setdefault(kind, ([], text))[0].append(rank)
    for ranks, text in said.values():
        yield f"{label}: rank(s) {ranks} {text}"


def _name_wrong_value(got: float | None, shown: str, want: float, own: list[float], known: dict) -> tuple[str, str]:
    """(the kind of mistake, a sentence naming it) for one rank's wrong answer ``got``."""
    if got is None:
        return "type", f"returned {shown}, not a number: return the mean loss as a float ({want:g} here)"
    if math.isnan(got):
        return "nan", ("returned nan: a rank with no losses took the mean of an empty list (0 / 0), and a collective "
                       "spread it to every rank. Count the losses instead of averaging them on each rank (the mean "
                       f"is {want:g})")
    for what, value in known.items():
        if math.isclose(got, value, rel_tol=1e-6) and not math.isclose(value, want, rel_tol=1e-6):
            extra = (": a rank with few losses weighs as much as one with many. Add up the sums and the counts over "
                     "the ranks, then divide") if "means" in what else ""
            return what, f"returned {got:g}, {what}; the mean of every loss is {want:g}{extra}"
    if math.isclose(got, sum(own) / len(own) if own else 0.0, rel_tol=1e-6, abs_tol=1e-9):
        return "own", (f"returned its own mean ({got:g} on the first): nothing came from the other ranks (the mean of "
                       f"every loss is {want:g})")
    return "other", f"returned {got:g}, expected {want:g} (the mean of every rank's losses)"
