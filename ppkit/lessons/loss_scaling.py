"""Lesson 08c: fp16's narrow range, and loss scaling with ``torch.amp.GradScaler``, on CPU.

    fp32_gradients   one fp32 backward of lesson 08b's GPT: every parameter's gradient, flattened
    cast_counts      those gradients stored in fp16 after multiplying by a scale: how many nonzero values become 0
                     (underflow, below 2^-24), how many lose precision (subnormal, below 2^-14), how many become
                     inf (overflow, above 65504)
    fp16_backward    the whole backward run in fp16 (``model.half()``), the loss multiplied by ``scale`` and the
                     gradients divided by it after, in fp32: the gradients fp32 has and fp16 lost, counted
    autocast_backward  the same under ``torch.autocast("cpu", float16)``: the weights stay fp32 (the master
                     copy), the matmuls run in fp16, and the loss comes out in fp32, so a scale of 2^16
                     (GradScaler's default) does not overflow it
    scaler_history   a training loop under fp16 autocast with GradScaler: the scale at every step, growing after
                     ``growth_interval`` clean steps and halved (the step skipped) after an inf or nan, injected

fp16 has 5 exponent bits: normal values from 2^-14 (6.1e-5) to 65504, subnormals down to 2^-24 (6e-8). Gradients
are often smaller than that, so they become 0 in fp16. Multiplying the loss by S multiplies every gradient by S
(backward is linear in the loss): they move into fp16's range, and are divided by S in fp32 before the update.
bf16 has fp32's 8 exponent bits, so bf16 training needs no scaling (notebook 08b's autocast).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppkit.errors import ConfigError
from ppkit.lessons import step_memory as sm
from ppkit.lessons.cpu_threads import threads

FP16 = torch.finfo(torch.float16)
SMALLEST_SUBNORMAL = 2.0 ** -24


def fp32_gradients(size: sm.Size = sm.SIZE, s: int = 128, b: int = 4) -> torch.Tensor:
    model = sm.GPT(size)
    with threads():
        model.loss(sm.batch(size, b, s)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def cast_counts(grads: torch.Tensor, scale: float = 1.0) -> dict[str, int]:
    """``grads * scale`` stored in fp16: nonzero values that became 0, that are subnormal, that became inf."""
    if not scale > 0:
        raise ConfigError(f"a loss scale must be above 0; got {scale!r}.")
    scaled = grads * scale
    half = scaled.half()
    nonzero = grads != 0
    return {"scale": scale, "nonzero": int(nonzero.sum()),
            "underflow to 0": int((nonzero & (half == 0)).sum()),
            "subnormal": int((half != 0).logical_and(half.abs() < FP16.smallest_normal).sum()),
            "overflow to inf": int(torch.isinf(half).sum())}


def fp16_backward(size: sm.Size = sm.SIZE, s: int = 128, b: int = 4, scale: float = 1.0,
                  reference: torch.Tensor | None = None) -> dict[str, float]:
    """Backward of ``scale`` x loss with the model in fp16, gradients divided by ``scale`` in fp32: how many
    gradients that fp32 finds nonzero came out 0, and whether any came out inf or nan."""
    return _scaled_backward(sm.GPT(size).half(), False, size, s, b, scale, reference)


def autocast_backward(size: sm.Size = sm.SIZE, s: int = 128, b: int = 4, scale: float = 1.0,
                      reference: torch.Tensor | None = None) -> dict[str, float]:
    """``fp16_backward`` under ``torch.autocast("cpu", float16)`` with the weights in fp32: the loss's dtype (fp32:
    autocast runs the loss in fp32), the gradients lost and the inf or nan among them."""
    return _scaled_backward(sm.GPT(size), True, size, s, b, scale, reference)


def _scaled_backward(model, autocast: bool, size: sm.Size, s: int, b: int, scale: float,
                     reference: torch.Tensor | None) -> dict[str, float]:
    reference = fp32_gradients(size, s, b) if reference is None else reference
    with threads():
        with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = model.loss(sm.batch(size, b, s))
        (loss * scale).backward()
    grads = torch.cat([p.grad.flatten().float() / scale for p in model.parameters()])
    finite = torch.isfinite(grads)
    return {"scale": scale, "loss dtype": loss.dtype, "weights dtype": next(model.parameters()).dtype,
            "lost (0 in fp16, not in fp32)": int(((grads == 0) & (reference != 0)).sum()),
            "inf or nan": int((~finite).sum()),
            "largest error vs fp32": float((grads[finite] - reference[finite]).abs().max())}


@dataclass(frozen=True)
class ScalerStep:
    step: int
    scale: float      # the scale this step's loss was multiplied by
    skipped: bool     # GradScaler found an inf or nan in the gradients and did not update the weights
    injected: bool    # this step's loss was made inf on purpose


def scaler_history(steps: int = 10, inject_at: tuple[int, ...] = (6,), init_scale: float = 2.0 ** 10,
                   growth_interval: int = 2, size: sm.Size = sm.SIZE, s: int = 32, b: int = 2) -> list[ScalerStep]:
    """Train ``steps`` steps under ``torch.autocast("cpu", float16)`` with ``GradScaler("cpu")``; at each step
    in ``inject_at`` the loss is multiplied by inf, as an overflow would make it."""
    if steps < 1 or growth_interval < 1:
        raise ConfigError(f"steps and growth_interval must be at least 1; got {steps} and {growth_interval}.")
    model = sm.GPT(size)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    history = []
    with threads():
        for step in range(steps):
            history.append(_scaler_step(model, optimizer, scaler, step, step in inject_at, size, s, b))
    return history


def _scaler_step(model, optimizer, scaler, step: int, inject: bool, size: sm.Size, s: int, b: int) -> ScalerStep:
    """One step of ``scaler_history``: the scale it used, and whether GradScaler skipped the update."""
    tokens = sm.batch(size, b, s, seed=step)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model.loss(tokens)
    if inject:
        loss = loss * float("inf")
    scale = scaler.get_scale()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(loss).backward()
    scaler.step(optimizer)  # unscales, and skips the update if any gradient is inf or nan
    scaler.update()         # grows the scale after growth_interval clean steps, halves it after a bad one
    optimizer.zero_grad(set_to_none=True)
    unchanged = all(torch.equal(p0, p) for p0, p in zip(before, model.parameters()))
    return ScalerStep(step, scale, unchanged, inject)
