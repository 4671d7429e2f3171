"""Adam's amplified rounding, allowed where the record shows it can happen. Adam and AdamW divide each element's
update by the root of its own squared gradients, so an element whose gradient is zero but for rounding (the key
bias of an attention layer: softmax does not change when the same number is added to every score) takes an update
of the size of the learning rate and either sign, decided by float32's rounding. A correct parallel run rounds
otherwise and moves such an element another way.

So a parameter's element may differ from the reference's by up to twice the reference's largest update of that
tensor, per step at which the reference's gradient of that element was within the gradient tolerance of zero; no
other element gets any allowance. The reference keeps its gradients beside its parameters for this
(``ParityRun.step_grads``, a one-process run recording parameters). What it can hide: a bug that changes only
elements whose gradient is zero but for rounding, by less than those updates; with SGD those elements move by
rounding only, so the allowance is loose there.
"""

from __future__ import annotations

import torch

from ppkit.parity.record import ParityRun
from ppkit.parity.tolerance import chosen_tolerance


def allowance(ref: ParityRun, step: int, name: str, rtol, atol) -> torch.Tensor | None:
    """Per element of the reference's parameter ``name`` at ``step``: how far a correct run may be from it by
    Adam's amplified rounding (None: nowhere)."""
    total = None
    for s in sorted(t for t in ref.step_grads if t < step):
        grad = ref.step_grads[s].get(name)
        before, after = ref.tensors.get(s, {}).get(name), ref.tensors.get(s + 1, {}).get(name)
        if grad is None or grad.value is None or before is None or after is None or before.value is None \
                or after.value is None or grad.value.shape != before.value.shape or not grad.value.numel():
            continue
        g = grad.value.double()
        tolerance = chosen_tolerance(grad.dtype or str(grad.value.dtype), rtol, atol)
        free = g.abs() <= tolerance.bound(float(g.abs().max()), s)
        if not free.any():
            continue
        update = float((after.value.double() - before.value.double()).abs().max())
        add = free.double() * (2 * update)
        total = add if total is None else total + add
    return total
