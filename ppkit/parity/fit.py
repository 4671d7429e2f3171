"""Whether one tensor is another but for rounding: the test every shape of diagnose.py is made of. A shape fits
where what is left of the difference is within the case's own tolerance (the test that found it), so a rank said to
equal the reference passed that test."""

from __future__ import annotations

import torch

from ppkit.parity.case import Case

UNIT = 1e-3  # a factor this close to 1 is no factor: a drift past the tolerance, not a scale


def fits(case: Case, got: torch.Tensor, want: torch.Tensor) -> bool:
    """got equals want but for the rounding the case's tolerance allows (the test that found the difference: a
    shape fits exactly where a rank's piece would have passed)."""
    if got.shape != want.shape:
        return False
    if not got.numel():
        return True
    scale = max(case.scale, float(want.abs().max()))
    return case.tolerance.allows(float((got - want).abs().max()), scale, case.step)


def as_factor(c: float) -> str:
    """c as a factor, with the digits that tell it from 1."""
    return f"{c:.4g}x" if abs(c - 1) < 1e-2 else f"{c:.3g}x"


def loose_tolerance(case: Case) -> bool:
    """The case was judged in a precision coarser than float32, whose rounding can hide a fit."""
    return case.tolerance.dtype not in ("torch.float32", "torch.float64", "")

