"""Lesson 08c: FP8's two formats, measured by casting, per-tensor scaling, and what runs on a CPU.

    format_table    for e4m3fn and e5m2 (and fp16, bf16 beside them): the largest value, the smallest normal and
                    the smallest subnormal found by casting, what a value beyond the largest becomes, and the
                    relative rounding error over a sweep of values inside the range (median and worst)
    scaled_cast     a tensor cast to FP8 as is, and with a per-tensor scale (amax -> scale = the format's largest
                    value / amax: 448 / amax in e4m3fn, 57344 / amax in e5m2; stored beside the FP8 values, divided
                    out when reading): values lost to 0, values left subnormal, and the relative error
    what_runs_here  each FP8 operation tried on this machine: casting, an FP8 matmul with ``torch._scaled_mm``
                    (timed against fp32 on the same shapes), and whether a GPU that has FP8 units is present

e4m3fn: 4 exponent bits, 3 mantissa bits, no infinity ("fn": finite, with a nan); e5m2: 5 and 2, fp16's range
with less precision. Before Blackwell, Transformer Engine's default recipe is hybrid (``DelayedScaling``'s default
``fp8_format``: e4m3 in forward, e5m2 for the gradients) with delayed scaling (each tensor's scale from the amax
history of earlier iterations); TE 2.x on Blackwell defaults to MXFP8 block scaling, in e4m3. DeepSeek-V3 uses e4m3
for every FP8 GEMM input, gradients included, with a scale computed online per 1 x 128 tile of activations and per
128 x 128 block of weights; its embedding, output head, MoE gating, norms and attention stay in BF16/FP32, its
master weights and weight gradients in FP32, Adam's moments in BF16.
"""

from __future__ import annotations

import time

import torch

from ppkit import compat
from ppkit.errors import ConfigError
from ppkit.lessons import gpus
from ppkit.lessons.cpu_threads import threads

FORMATS = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "fp16": torch.float16, "bf16": torch.bfloat16}


def _roundtrip(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).to(torch.float32)


def format_table(points: int = 4001) -> dict[str, dict[str, object]]:
    """Each format's range and precision, found by casting fp32 values (``torch.finfo``'s numbers beside)."""
    powers = torch.tensor([2.0 ** -k for k in range(0, 150)])  # down to fp32's smallest subnormal
    table = {}
    for name, dtype in FORMATS.items():
        info = torch.finfo(dtype)
        kept = powers[_roundtrip(powers, dtype) != 0]
        beyond = _roundtrip(torch.tensor([info.max * 4]), dtype).item()
        sweep = torch.logspace(torch.log10(torch.tensor(info.smallest_normal)).item(),
                               torch.log10(torch.tensor(info.max)).item(), points)
        rel = ((_roundtrip(sweep, dtype) - sweep).abs() / sweep)
        table[name] = {"largest": _roundtrip(torch.tensor([info.max]), dtype).item(),
                       "smallest normal": info.smallest_normal, "smallest subnormal (cast)": kept.min().item(),
                       "4 x largest becomes": beyond, "median relative error": rel.median().item(),
                       "worst relative error": rel.max().item(), "bits": info.bits}
    return table


def scaled_cast(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn) -> dict[str, dict[str, float]]:
    """``x`` in FP8 without and with a per-tensor scale (the format's largest value / amax): values that became 0,
    values left subnormal (nonzero, below the format's smallest normal: fewer bits), and the relative error."""
    if not x.is_floating_point() or x.numel() == 0:
        raise ConfigError(f"scaled_cast needs a non-empty floating-point tensor; got {x.dtype} of {x.numel()} values.")
    amax = x.abs().max().item()
    fp8_max, smallest_normal = torch.finfo(dtype).max, torch.finfo(dtype).smallest_normal
    scale = fp8_max / amax if amax > 0 else 1.0
    out = {}
    for name, s in (("no scale", 1.0), (f"scale {scale:.3g} (max / amax)", scale)):
        cast = (x * s).to(dtype).to(torch.float32)
        back = cast / s
        nonzero = x != 0
        out[name] = {"scale": s, "lost to 0": int((nonzero & (back == 0)).sum()),
                     "subnormal": int(((cast != 0) & (cast.abs() < smallest_normal)).sum()),
                     "median relative error": ((back - x).abs() / x.abs())[nonzero].median().item()}
    return out


def _time(fn, repeats: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def what_runs_here(n: int = 256) -> dict[str, str]:
    """Try each FP8 operation on this machine; a line each: ran (with a time) or failed (with torch's words)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    said = {}
    try:
        a8 = a.to(torch.float8_e4m3fn)
        said["cast to e4m3fn and back"] = f"runs: {a8.element_size()} byte a value, {a8.nbytes} bytes for {n}x{n}"
    except (RuntimeError, TypeError) as err:
        said["cast to e4m3fn and back"] = f"fails: {err}"
        return said
    one = torch.tensor(1.0)
    b8 = b.to(torch.float8_e4m3fn).t()  # _scaled_mm wants its second operand column-major
    try:
        with threads():  # one thread for both, as the peak was measured
            fp8 = _time(lambda: compat.scaled_mm(a8, b8, one, one, torch.float32))
            fp32 = _time(lambda: a @ b)
        said["torch._scaled_mm (FP8 matmul) on CPU"] = (f"runs: {fp8 * 1e3:.2f} ms for {n}x{n}, fp32 matmul "
                                                      f"{fp32 * 1e3:.2f} ms ({fp8 / fp32:.1f}x its time)")
    except (RuntimeError, NotImplementedError) as err:
        said["torch._scaled_mm (FP8 matmul) on CPU"] = f"fails: {str(err).splitlines()[0]}"
    fp8_gpus = [d["name"] for d in gpus.devices() if tuple(d["capability"]) >= (8, 9)]  # asked outside the kernel
    said["a GPU with FP8 tensor cores (compute capability 8.9+: Ada, H100)"] = (
        f"present: {', '.join(fp8_gpus)}" if fp8_gpus else "none here")
    return said
