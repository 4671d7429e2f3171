"""08c on a GPU: a training step's MFU against the GPU's datasheet peak, and FP8 matmuls against 16-bit ones (bf16, or
fp16 on a GPU without bf16 tensor cores: ``half_precision``).

Each measurement runs in a fresh interpreter (``measure``), never in the kernel: it initialises CUDA, and the
kernel keeps no CUDA context. Without a GPU each says so with a ConfigError; the CPU lesson (an
achievable fp32 peak measured here, step_flops.py) is unchanged.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from ppkit.errors import ConfigError
from ppkit.lessons import gpus
from ppkit.lessons import step_flops as sf
from ppkit.lessons import step_memory as sm

GPU_SIZE = {"vocab": 256, "d_model": 1024, "heads": 16, "layers": 4, "attention": "sdpa"}  # enough work for a GPU


def _gpu() -> tuple[str, gpus.DatasheetPeak | None]:
    if not torch.cuda.is_available():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError("no GPU here (torch.cuda.is_available() is False in this process"
                          + (f", CUDA_VISIBLE_DEVICES={shown!r}" if shown is not None else "")
                          + "): the GPU measurements of 08c need one; the notebook's CPU measurements stand for them.")
    name = torch.cuda.get_device_name()
    return name, gpus.datasheet_peak(name)


def half_precision(device_name: str, capability: tuple[int, int]) -> tuple[str, torch.dtype, float | None]:
    """The 16-bit type a GPU's tensor cores run, with its dense datasheet peak: ('bf16', torch.bfloat16, peak)
    where the GPU has bf16 tensor cores, else ('fp16', torch.float16, peak): a T4 (Colab's, Kaggle's) has fp16
    ones only, and bf16 there runs without them. The peak is None for a GPU not in ppkit's table, whose
    compute capability then decides (bf16 tensor cores from 8.0, Ampere).

    >>> half_precision("Tesla T4", (7, 5))[0]
    'fp16'
    """
    peak = gpus.datasheet_peak(device_name)
    has_bf16 = peak.bf16 is not None if peak else tuple(capability) >= (8, 0)
    if has_bf16:
        return "bf16", torch.bfloat16, peak.bf16 if peak else None
    return "fp16", torch.float16, peak.fp16 if peak else None


def _median_seconds(fn, repeats: int) -> float:
    fn()  # start-up, cuBLAS's choice of kernels
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def step_mfu(seq_len: int = 1024, microbatch_size: int = 8, repeats: int = 10, **size) -> dict:
    """One training step (forward, backward, Adam) of 08b's GPT under autocast on this process's GPU, in the
    16-bit type its tensor cores run (``half_precision``: bf16, or fp16 with loss scaling on a GPU without bf16
    tensor cores, a T4): its time and MFU against the datasheet's dense peak for that type (None for a GPU not
    in ppkit's table). ``autocast`` in the result says which type was used."""
    name, _ = _gpu()
    half, dtype, peak = half_precision(name, torch.cuda.get_device_capability())
    shape = sm.Size(**{**GPU_SIZE, **size})
    model = sm.GPT(shape, 0).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=half == "fp16")  # fp16 gradients underflow without it
    tokens = sm.batch(shape, microbatch_size, seq_len).cuda()

    def step():
        with torch.autocast("cuda", dtype):
            loss = model.loss(tokens)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    seconds = _median_seconds(step, repeats)
    flops = sf.formula_flops(shape, seq_len, microbatch_size)["model"]
    return {"gpu": name, "autocast": half, "seconds": seconds, "model_flops": flops, "peak": peak,
            "MFU": flops / seconds / peak if peak else None}


def fp8_matmul(n: int = 8192, repeats: int = 10) -> dict:
    """An n x n matmul in the GPU's 16-bit type (``half_precision``: bf16, or fp16 on a GPU without bf16 tensor
    cores) and in FP8 (``torch._scaled_mm``, e4m3) on this process's GPU: each one's rate and its fraction of the
    datasheet's dense peak for that type; FP8 None where the GPU has no FP8 tensor cores (before 8.9)."""
    name, peak = _gpu()
    capability = torch.cuda.get_device_capability()
    half, dtype, half_peak = half_precision(name, capability)
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    a16, b16 = a.to(dtype), b.to(dtype)
    half_rate = 2 * n ** 3 / _median_seconds(lambda: a16 @ b16, repeats)
    said = {"gpu": name, "n": n, "half": half, "half_flops_per_s": half_rate,
            "half_of_peak": half_rate / half_peak if half_peak else None, "fp8_flops_per_s": None, "fp8_of_peak": None}
    if capability >= (8, 9):
        from ppkit import compat

        one = torch.tensor(1.0, device="cuda")
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # column-major second operand
        fp8_rate = 2 * n ** 3 / _median_seconds(lambda: compat.scaled_mm(a8, b8, one, one, torch.bfloat16), repeats)
        said.update(fp8_flops_per_s=fp8_rate, fp8_of_peak=fp8_rate / peak.fp8 if peak and peak.fp8 else None)
    return said


def measure(what: str, device: int = 0, timeout_s: float = 300.0, **kwargs) -> dict:
    """``step_mfu`` or ``fp8_matmul`` run in a fresh interpreter on the kernel's GPU ``device`` (the ``index`` of
    ``gpus.devices()``), as the kernel may ask for them: that interpreter sees that GPU alone
    (CUDA_VISIBLE_DEVICES), so each GPU of a machine with several is measured on itself."""
    if what not in ("step_mfu", "fp8_matmul"):
        raise ConfigError(f"gpu_speed.measure measures 'step_mfu' or 'fp8_matmul', not {what!r}.")
    return {"device": device, **gpus.in_fresh_process("ppkit.lessons.gpu_speed", what, timeout_s=timeout_s,
                                                       env={"CUDA_VISIBLE_DEVICES": _visible(device)}, **kwargs)}


def _visible(device: int) -> str:
    """CUDA_VISIBLE_DEVICES for a process that is to see the kernel's GPU ``device`` alone: its entry in the
    kernel's own CUDA_VISIBLE_DEVICES where that is set (GPU 1 of "4,6" is "6"), else the index itself."""
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ConfigError(f"gpu_speed.measure wants a GPU's index (the 'index' of gpus.devices()), got "
                          f"device={device!r}.")
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    if shown is None:
        return str(device)
    entries = [e.strip() for e in shown.split(",") if e.strip()]
    if device >= len(entries):
        raise ConfigError(f"gpu_speed.measure(device={device}): this kernel sees {len(entries)} GPUs "
                          f"(CUDA_VISIBLE_DEVICES={shown!r}); pass the 'index' of one of gpus.devices().")
    return entries[device]
