"""Notebook 14's planted-bug exercise: fix the tensor-parallel MLP block that ``ppkit.compare_runs`` finds wrong.

    check_tp_mlp(fn)    fn(x, fc1, fc2, log) -> the block's whole output, from this rank's shards

Each case trains ``ppkit.lessons.parity_tp.Net`` with the learner's block on k ranks and compares every step's
loss and gradients with one process (``ppkit.compare_runs``). The wrong fixes people make are named: the bug left
in, the input all_reduced in forward too (the block sees world_size x its input), the input's gradient divided
by world_size (a mean where the ranks' parts must be summed) or summed twice, the bias added on every rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppkit.checks import check_callable
from ppkit.cluster.controller import Cluster
from ppkit.exercises.report import CheckReport
from ppkit.exercises.subworld import NOT_WRITTEN, check_on_ranks
from ppkit.lessons import parity_tp
from ppkit.parity import ParityReport, compare_runs

WORLD_SIZES = (2, 4)
STEPS = 2


def _job(rank, k, fn, steps):
    try:
        run, calls = parity_tp.train(rank, k, fn, steps)
    except NotImplementedError:
        return NOT_WRITTEN
    return run, calls


def check_tp_mlp(fn, world_sizes=WORLD_SIZES, steps: int = STEPS, timeout: float = 30,
                 cluster: Cluster | None = None) -> CheckReport:
    """Check ``fn(x, fc1, fc2, log)``: trained on k ranks, the model's losses and gradients equal one process's
    at every step (``ppkit.compare_runs``, its default tolerance)."""
    check_callable(fn, "tp_mlp(x, fc1, fc2, log)")
    reference = parity_tp.reference(steps)

    def problems(k, results):
        report = compare_runs(reference, [run for run, _ in results])
        if not report.equal:
            yield f"world_size {k}: {_named(k, report, results[0][0].losses[0])} (ppkit.compare_runs: {report.first})"

    return check_on_ranks(CheckReport("tp_mlp"), fn, world_sizes, timeout, cluster,
                          lambda k: f"world_size {k}, {steps} SGD steps against one process", _job, (fn, steps),
                          problems)


def _named(k: int, report: ParityReport, loss0: float) -> str:
    """The wrong fix that explains ``report``, in a sentence."""
    first, what = report.first, report.diagnosis.what
    if first.kind == "loss" and first.step == 0:
        if _close(loss0, first_loss(input_scale=k)):
            return (f"the block's input was all_reduced in forward too: every rank already holds all of x, so the "
                    f"block saw {k} x x. The input's all_reduce belongs in backward only: copy_to_parallel(x, log, "
                    "'fc1'), identity forward")
        if _close(loss0, first_loss(bias_scale=k)):
            return (f"fc2's bias counts {k} times: each rank added it before the sum. Add it once, after "
                    "reduce_from_parallel")
        return f"the block's output is wrong already in forward (the loss at step 0 differs): {what}"
    if first.kind == "grad" and first.name.startswith("inp."):
        if "holds only its own part" in what:
            return ("the bug is still there: each rank's gradient of the block's input is only its own part. Pass "
                    "x through copy_to_parallel(x, log, 'fc1') before fc1: identity forward, all_reduce backward")
        if f"is 1/{k} of the reference" in what:
            return (f"the input's gradient was divided by {k}: the ranks' parts must be summed, not averaged (each "
                    "holds a different part of the same gradient); keep copy_to_parallel's all_reduce, drop the "
                    "division")
        if f"is {k}x the reference" in what:
            return (f"the input's gradient is {k}x too large: it was summed twice (copy_to_parallel and another "
                    "all_reduce in backward); keep one")
        return f"the forward is right but the gradient of the layer before the block is not: {what}"
    return f"{what}: read the parity report below and compare your block with planted_tp_mlp"


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-5 * max(abs(b), 1e-12)


def first_loss(input_scale: float = 1.0, bias_scale: float = 1.0) -> float:
    """Step 0's loss of a block that multiplies its input by ``input_scale`` and fc2's bias by ``bias_scale``: what
    an input all_reduced in forward over k ranks (input_scale=k), or a bias added on each of them, gives."""
    net = parity_tp.Net()
    x, y = parity_tp.batch(0)
    with torch.no_grad():
        h = torch.tanh(net.inp(x)) * input_scale
        out = F.linear(F.gelu(net.mlp.fc1(h)), net.mlp.fc2.weight) + bias_scale * net.mlp.fc2.bias
        return float(F.mse_loss(net.head(out), y))
