"""Notebook 02's planted-bug exercise: fix the training loop whose loss logging only rank 0 calls.

    check_logged_train_loop(fn)    every rank returns (the mean losses logged, the final weights)

The ranks run in process groups that check every collective as ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does,
so a fix that still leaves the ranks' collectives out of step is named at once, not a hang. The wrong
fixes people make are named too: the loss's all_reduce deleted (each rank logs its own loss), logging
left to rank 0 alone, the sum logged rather than the mean, the gradients no longer averaged.
"""

from __future__ import annotations

import math
import re

import torch
import torch.distributed as dist

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.check_debugging import MISMATCH
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks
from ppkit.lessons.collective_bug import LOG_EVERY, LR, batch, loss_and_grad, reference

WORLD_SIZES = (4,)
STEPS = 4
_CALL = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+,?\s*"
                   r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\])?")


def _job(rank, k, fn, steps):
    """The learner's loop, then a barrier every rank reaches only if all made the same collective calls."""
    try:
        got = fn(rank, k, steps)
        dist.barrier()
        return ("returned", got)
    except NotImplementedError:
        return NOT_WRITTEN
    except RuntimeError as err:  # only the DETAIL check's mismatch is named here; any other error reaches the checker
        if MISMATCH in str(err):
            return ("mismatch", str(err))
        raise


def check_logged_train_loop(fn, world_sizes=WORLD_SIZES, steps: int = STEPS, timeout: float = 20,
                            cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(rank, world_size, steps) -> (logged, weights)``: every rank logs the mean loss over the ranks
    at steps 0, 2, ... and ends with the weights a right data-parallel loop gives (``collective_bug.reference``)."""
    check_callable(fn, "fn(rank, world_size, steps)")

    def problems(k, results):
        mismatched = [r for r in results if r[0] == "mismatch"]
        if mismatched:
            calls = sorted({(int(r), op, shape) for m in mismatched for r, op, shape in _CALL.findall(m[1])})
            shown = ", ".join(f"rank {r} {op} of [{shape}]" for r, op, shape in calls) or "see the error"
            yield (f"world_size {k}: the ranks still call different collectives at the same point ({shown}): every "
                   "rank must call the loss's all_reduce at the same steps; only printing may stay on rank 0. "
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL caught it; without it this hangs or gloo aborts a rank")
            return
        yield from _wrong(k, steps, {rank: r[1] for rank, r in enumerate(results)})

    return check_on_ranks(CheckReport("logged train loop"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k}, {steps} steps, the loss logged every {LOG_EVERY}",
                          _job, (fn, steps), problems, detail=True)


def _close(a, b) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-7) for x, y in zip(a, b))


def _wrong(k: int, steps: int, got: dict):
    logged, weights, own = reference(k, steps)
    said: dict[str, tuple[list[int], str]] = {}  # kind of mistake -> (ranks, the sentence)
    for rank, value in sorted(got.items()):
        named = _name(value, k, steps, logged, weights, own[rank])
        if named is not None:
            said.setdefault(named[0], ([], named[1]))[0].append(rank)
    for ranks, text in said.values():
        yield f"world_size {k}: rank(s) {ranks} {text}"


def _name(value, k: int, steps: int, logged, weights, own) -> tuple[str, str] | None:
    """(the kind of mistake, a sentence naming it) for one rank's answer, or None if it is right."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        return "shape", f"returned {value!r:.60}, not (logged losses, final weights)"
    mine, final = [float(x) for x in value[0]], [float(x) for x in value[1]]
    if not _close(final, weights):
        if _close(final, _unaveraged(k, steps)):
            return "weights", "ended with other weights: the gradients' sum was not divided by world_size"
        return "weights", (f"ended with weights {[round(w, 4) for w in final]}, expected "
                           f"{[round(w, 4) for w in weights]}: keep the gradient all_reduce and its average")
    if _close(mine, logged):
        return None
    if not mine:
        return "none", ("logged nothing: every rank must return the logged mean losses, so every rank calls the "
                        "loss's all_reduce (printing may stay on rank 0)")
    if _close(mine, own):
        return "own", ("logged its own loss, not the mean over the ranks: the loss's all_reduce was deleted rather "
                       "than called on every rank")
    if _close(mine, [x * k for x in logged]):
        return "sum", f"logged the sum of the ranks' losses: divide by world_size ({k})"
    return "other", (f"logged {[round(x, 4) for x in mine]}, expected {[round(x, 4) for x in logged]} (the mean "
                     f"loss at steps 0, {LOG_EVERY}, ...)")


def _unaveraged(k: int, steps: int) -> list[float]:
    """The weights of a loop that forgets to divide the gradients' sum by world_size."""
    weights = torch.zeros(3)
    for step in range(steps):
        weights = weights - LR * sum(loss_and_grad(weights, *batch(r, step))[1] for r in range(k))
    return weights.tolist()
