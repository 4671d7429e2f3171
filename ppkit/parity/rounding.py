"""What a precision's rounding explains and what it hides, in words: a loss within a bfloat16 tolerance is no
evidence about the forward (it can still be 2 % wrong), bfloat16's tolerance can hide a shape's fit, and a small
difference judged in float32 can be a lower precision's rounding that the recorder did not see."""

from __future__ import annotations

from ppkit.parity.case import Case
from ppkit.parity.fit import UNIT, loose_tolerance
from ppkit.parity.tolerance import default_tolerance


def no_shape(case: Case) -> str:
    """What the shapes' tests ruled out, and, under a loose tolerance, that they could not rule it out."""
    rtol = case.tolerance.at(case.step)[0]
    of = "of the reference's loss" if case.kind == "loss" else "of the tensor's largest value"
    if not loose_tolerance(case):
        return (f"no scale (beyond {UNIT:.1%}), partial sum nor swapped piece fits it to within the tolerance "
                f"({rtol:.2g} {of})")
    dtype = case.tolerance.dtype.removeprefix("torch.")
    return (f"no scale, partial sum nor swapped piece fits it to within {dtype}'s tolerance ({rtol:.2g} {of}), "
            f"but {dtype}'s rounding is large enough to hide such a fit, so the record cannot tell whether one of "
            "them is the cause")


def loose(case: Case) -> str:
    """A loss that passed only within a loose tolerance is no evidence about the forward: say so."""
    if case.forward != "loose" or case.loss_rel is None:
        return ""
    dtype = (case.loss_dtype or "torch.float32").removeprefix("torch.")
    return (f"; the loss at step {case.step} passed, but only within the {dtype} tolerance: the largest rank's "
            f"loss differs by {case.loss_rel:.2g} of the reference's, so it does not show that the forward is right")


def unseen_precision(case: Case, rel: float) -> str:
    """A float32-judged difference small enough to be a lower precision's rounding, on a rank whose loss graph
    the recorder did not see (a float32 graph rules it out): name that explanation too."""
    if case.tolerance.dtype != "torch.float32" or not case.tolerance.grows or case.graph:
        return ""
    if rel > default_tolerance("torch.bfloat16").at(case.step)[0]:
        return ""
    return ("; or, if the run computed in bfloat16 where the recorder could not see it (an autocast region that "
            "ended before record, on ranks whose loss is a number, detached or absent, as a pipeline stage's "
            "without the loss is), a difference this size is that rounding: ParityRecorder(precision=torch.bfloat16) "
            "on the ranks then compares within it")

