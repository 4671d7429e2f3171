"""Adam's amplified rounding, allowed where the record shows it can happen. Adam and AdamW divide each element's
update by the root of its own squared gradients, so an element whose gradient is zero but for rounding (the key
bias of an attention layer: softmax does not change when the same number is added to every score) takes an update
of the size of the learning rate and either sign, decided by float32's rounding. A correct parallel run rounds
otherwise and moves such an element another way.

So a parameter's element may differ from the reference's by up to twice the reference's largest update of that
tensor, per step at which the reference's gradient of that element was within the comparison's tolerance of zero
where the reference's update of the tensor is not c x its gradient (a plain SGD step moves every element by lr x
its gradient: none is amplified); no other element gets any allowance. The tolerance is the comparison's own, that of
the precision the run computed in: under bfloat16 a gradient element below bfloat16's rounding of the largest one
can come out with the other sign, and Adam's first update, lr x sign(g), then moves it 2 x lr the other way (a
correct DDP run under autocast, AdamW at lr 1e-2: 0.02 on a tensor whose largest value is 0.135, where bfloat16's
tolerance allows 0.012). The reference keeps its gradients beside its parameters for this (``ParityRun.step_grads``,
a one-process run recording parameters). What it can hide: a bug that changes only elements whose gradient is zero
but for rounding, by less than those updates; with momentum or weight decay such an element can move for other
reasons than rounding, and the allowance is loose there.
"""

from __future__ import annotations

import torch

from ppkit.parity.record import ParityRun
from ppkit.parity.tolerance import Tolerance


def allowance(ref: ParityRun, step: int, name: str, tolerance: Tolerance) -> torch.Tensor | None:
    """Per element of the reference's parameter ``name`` at ``step``: how far a correct run may be from it by
    Adam's amplified rounding (None: nowhere); ``tolerance``: the comparison's, which says which gradient elements
    are zero but for the run's rounding."""
    total = None
    for s in sorted(t for t in ref.step_grads if t < step):
        grad = ref.step_grads[s].get(name)
        before, after = ref.tensors.get(s, {}).get(name), ref.tensors.get(s + 1, {}).get(name)
        if grad is None or grad.value is None or before is None or after is None or before.value is None \
                or after.value is None or grad.value.shape != before.value.shape or not grad.value.numel():
            continue
        g = grad.value.double()
        moved = after.value.double() - before.value.double()
        if _proportional(moved, g, before.value.double()):
            continue  # a plain SGD step, -lr x g: nothing divides a small gradient by itself
        free = g.abs() <= tolerance.bound(float(g.abs().max()), s)
        if not free.any():
            continue
        update = float(moved.abs().max())
        add = free.double() * (2 * update)
        total = add if total is None else total + add
    return total


def _proportional(moved: torch.Tensor, g: torch.Tensor, before: torch.Tensor) -> bool:
    """The reference's update is c x its gradient, to float32's rounding of the weights and 1 % of the update: a
    plain SGD step (momentum's first step too), which amplifies no element."""
    norm = float((g * g).sum())
    if norm == 0.0:
        return False
    c = float((moved * g).sum()) / norm
    slack = 1e-2 * float(moved.abs().max()) + 4 * torch.finfo(torch.float32).eps * float(before.abs().max())
    return float((moved - c * g).abs().max()) <= slack
