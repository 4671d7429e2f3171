"""How far a correct parallel run may be from one process: the tolerance ``compare_runs`` uses by default.

A correct parallel run computes the same sums in another order: an all_reduce adds the ranks' partial sums, a
row-parallel matmul splits its inner sum over ranks, a pipeline accumulates micro-batches' gradients one after
another. Floating-point addition is not associative, so each reordered sum of n terms may differ by up to about
n * eps * sum|x| and typically sqrt(n) * eps * sum|x| (Higham, *Accuracy and Stability of Numerical Algorithms*,
ch. 4). The default takes

    rtol = (sqrt(REDUCTION_TERMS) * eps(accumulator) + ROUNDINGS * eps(dtype)) * (1 + step)

- ``REDUCTION_TERMS`` = 4096 terms, more than any sum in the course's models, in the typical sqrt(n) case;
- the accumulator is float32 for bf16, fp16 and TF32 (matmuls accumulate in it) and the dtype itself otherwise;
- ``ROUNDINGS`` = 4 roundings to the dtype between the reordered sum and the recorded value; where the run
  computed in a lower precision than float32 (bf16, fp16, TF32) the difference is no longer a reordering but the
  rounding of every operand of every layer between the tensor and the loss, forward and backward, which grows
  with the depth: ``LOW_PRECISION_ROUNDINGS`` = 8 (measured below at up to 2.3 eps at step 0 on an 8-layer MLP);
- ``(1 + step)``: each step's rounding changes the next step's parameters, so a correct run drifts, about
  linearly over the few steps a parity check runs. In a lower precision the difference is dominated by each
  step's own rounding of the operands, which does not accumulate, and the parameters' drift it adds stays small:
  there the tolerance grows as ``sqrt(1 + step)`` (``LOW_GROWTH``). Measured over 10 steps (2 CPU ranks, DDP
  under bf16 autocast against the float32 reference, the largest difference of a gradient over its largest value,
  per step): the corpus MLP with SGD 0.004, 0.011, 0.0047, 0.0091, 0.013, 0.0062, 0.0049, 0.006, 0.01, 0.0076
  (FSDP2's MixedPrecisionPolicy the same); with lr 0.5 at most 0.017; an 8-layer MLP of width 32 with AdamW
  0.0093 at step 0 and at most 0.04 (step 4); the parameters at most 0.0019. No trend over the steps: the largest
  is 4.3x step 0's. sqrt(1 + step) allows 0.14 at step 4 (a margin of 3.5) and 0.2 at step 9, where (1 + step)
  allowed 0.63; a loss x 1.5 from step 6 on (a gradient 0.5 of its largest value away) was flagged at step 6 but
  within 2x the tolerance of 1, so no scale could be named; now it is named 1.5x.

The dtype is each tensor's own, and it is the precision the tensor was computed in, not the one it was stored
in (precision.py): under autocast or FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` the gradients
are float32 but the matmuls that made them rounded their operands to bfloat16, and on a GPU with TF32 on a
float32 matmul rounds them to 10 mantissa bits. Compared with a float32 reference, those roundings are the
difference; the least precise of the two sides' precisions sets the tolerance, and the report says which it used
and why.

It is measured against the whole tensor's largest value (the reference's), not element by element nor against
the piece one rank holds: an element near zero that came from cancellation carries the rounding of the large
terms it cancelled, and so does a rank's piece whose values all came out small. So a rank's piece passes when
``max|got - want| <= atol + rtol * max|reference tensor|``, with ``atol = eps`` of the accumulator (float32's
1.2e-7 for every dtype but float64): the floor of float32's own rounding, which a small tensor's correct run can
reach past rtol (notebook 14's Llama in float32 on dp2 x tp2, Adam: 1.6e-7 at step 1, 2.7e-5 of a gradient whose
largest value is 6e-3, where rtol alone allows 1.6e-5). Not eps(dtype): bf16's 7.8e-3, added to every comparison,
passed a 2x bug on gradients of 1e-3. A loss, one number, against its own size.
For float32 that is
rtol = 8.1e-6 at step 0; TF32 and fp16 7.8e-3; bf16 6.3e-2; float64 1.5e-14. Measured on tests/test_parity.py's
correct runs (2 CPU ranks, gloo, float32, small models, 2-3 steps: DP, DDP, FSDP2, TP by hand, DTensor TP with
SP, a 2-stage pipeline), the largest difference was 2.9e-7 of a tensor's largest value; its planted bugs differ
by 2e-2 (reordered micro-batches' loss) to 1 (a 2x gradient). Runs that compute in bfloat16, against the float32
reference: the same MLP (DDP under CPU autocast, and FSDP2's mixed precision, over 2 ranks, 3 steps of SGD) up to
1.1e-2 of a tensor's largest value (step 1); under autocast, an MLP of 8 layers of width 32 (DDP, AdamW, 10
steps) 1.8e-2 at step 0, at most 2.1e-2 later; notebook 14's Llama (one process, Adam, 3 steps) 8e-3 at step 0
and 2.7e-2 at step 1. The bf16 default allows 6.3e-2 at step 0 and 8.8e-2 at step 1: a margin of 3.3 at the
closest. What it lets pass, measured (DDP over 2 ranks under bf16 autocast, 3 steps, the loss x a planted factor
before backward, on every rank or on one): a factor of 1.05 passes as equal, 1.1 is flagged at step 0; a 2x on
notebook 14's Llama is flagged on all of its gradients. In float32 a factor of 1.02 is flagged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ppkit.errors import ConfigError
from ppkit.parity.precision import EPS

REDUCTION_TERMS = 4096
ROUNDINGS = 4
LOW_PRECISION_ROUNDINGS = 8
LOW_GROWTH = 0.5  # a lower precision's tolerance grows as sqrt(1 + step): measured, see the docstring


@dataclass(frozen=True)
class Tolerance:
    """``rtol`` (of the tensor's largest value) and ``atol`` at step 0; ``grows``: multiplied by (1 + step) **
    ``growth`` (1: linearly; 0.5: as its square root); ``dtype``: the precision it is derived for ("torch.float32",
    "tf32", ...)."""

    rtol: float
    atol: float
    dtype: str = ""
    grows: bool = True
    growth: float = 1.0

    def at(self, step: int) -> tuple[float, float]:
        factor = (1 + step) ** self.growth if self.grows else 1
        return self.rtol * factor, self.atol * factor

    def bound(self, scale: float, step: int) -> float:
        """The largest |difference| allowed in a tensor whose reference's largest |value| is ``scale``."""
        rtol, atol = self.at(step)
        return atol + rtol * scale

    def allows(self, diff: float, scale: float, step: int) -> bool:
        return diff <= self.bound(scale, step)

    def __str__(self) -> str:
        grows = ("" if not self.grows else " x (1 + step)" if self.growth == 1 else " x sqrt(1 + step)"
                 if self.growth == 0.5 else f" x (1 + step)^{self.growth:g}")
        return f"rtol {self.rtol:.2g}{grows} of a tensor's largest value, plus atol {self.atol:.2g}" + (
            f" ({self.dtype.removeprefix('torch.')})" if self.dtype else "")


def default_tolerance(dtype: str | torch.dtype) -> Tolerance:
    """The tolerance for tensors computed in ``dtype`` (a torch dtype or "tf32"), derived as the module's
    docstring says."""
    key = str(dtype) or "torch.float32"
    if key not in EPS:
        raise ConfigError(f"no default tolerance for {dtype}: parity compares floating-point runs "
                          f"({', '.join(EPS)}); pass rtol= and atol= to compare_runs.")
    eps = EPS[key]
    acc_eps = EPS[key] if key in ("torch.float64", "torch.float32") else EPS["torch.float32"]
    roundings = ROUNDINGS if key in ("torch.float64", "torch.float32") else LOW_PRECISION_ROUNDINGS
    rtol = math.sqrt(REDUCTION_TERMS) * acc_eps + roundings * eps
    return Tolerance(rtol, acc_eps, key, growth=1.0 if key in ("torch.float64", "torch.float32") else LOW_GROWTH)


def chosen_tolerance(dtype: str, rtol: float | None, atol: float | None) -> Tolerance:
    """The default for ``dtype`` with the learner's ``rtol``/``atol`` in place of its own (then it does not grow)."""
    for label, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
            raise ConfigError(f"compare_runs({label}={value!r}): give a number >= 0, or leave it out for the default "
                              "derived from the dtype (ppkit.parity.tolerance's docstring says how).")
    default = default_tolerance(dtype or "torch.float32")
    if rtol is None and atol is None:
        return default
    return Tolerance(default.rtol if rtol is None else float(rtol), default.atol if atol is None else float(atol),
                     default.dtype, grows=False, growth=default.growth)
