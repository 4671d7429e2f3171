"""08c on a GPU: a training step's MFU against the GPU's datasheet peak, and FP8 matmuls against bf16 ones.

Each measurement runs in a fresh interpreter (``measure``), never in the kernel: it initialises CUDA, and the
kernel keeps no CUDA context (issue 49). Without a GPU each says so with a ConfigError; the CPU lesson (an
achievable fp32 peak measured here, step_flops.py) is unchanged.
"""

from __future__ import annotations

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
        raise ConfigError("no GPU here (torch.cuda.is_available() is False in this process): the GPU measurements "
                          "of 08c need one; the notebook's CPU measurements stand for them.")
    name = torch.cuda.get_device_name()
    return name, gpus.datasheet_peak(name)


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
    """One training step (forward, backward, Adam) of 08b's GPT, bf16 autocast on this process's GPU: its time
    and MFU against the datasheet's dense bf16 peak (None for a GPU not in ppkit's table)."""
    name, peak = _gpu()
    shape = sm.Size(**{**GPU_SIZE, **size})
    model = sm.GPT(shape, 0).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = sm.batch(shape, microbatch_size, seq_len).cuda()

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = model.loss(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds = _median_seconds(step, repeats)
    flops = sf.formula_flops(shape, seq_len, microbatch_size)["model"]
    return {"gpu": name, "seconds": seconds, "model_flops": flops, "bf16_peak": peak.bf16 if peak else None,
            "MFU": flops / seconds / peak.bf16 if peak and peak.bf16 else None}


def fp8_matmul(n: int = 8192, repeats: int = 10) -> dict:
    """An n x n matmul in bf16 and in FP8 (``torch._scaled_mm``, e4m3) on this process's GPU: each one's rate and
    its fraction of the datasheet's dense peak for that type; FP8 None where the GPU has no FP8 tensor cores."""
    name, peak = _gpu()
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16_rate = 2 * n ** 3 / _median_seconds(lambda: a16 @ b16, repeats)
    said = {"gpu": name, "n": n, "bf16_flops_per_s": bf16_rate,
            "bf16_of_peak": bf16_rate / peak.bf16 if peak and peak.bf16 else None,
            "fp8_flops_per_s": None, "fp8_of_peak": None}
    if torch.cuda.get_device_capability() >= (8, 9):
        from ppkit import compat

        one = torch.tensor(1.0, device="cuda")
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # column-major second operand
        fp8_rate = 2 * n ** 3 / _median_seconds(lambda: compat.scaled_mm(a8, b8, one, one, torch.bfloat16), repeats)
        said.update(fp8_flops_per_s=fp8_rate, fp8_of_peak=fp8_rate / peak.fp8 if peak and peak.fp8 else None)
    return said


def measure(what: str, timeout_s: float = 300.0, **kwargs) -> dict:
    """``step_mfu`` or ``fp8_matmul`` run in a fresh interpreter, as the kernel may ask for them."""
    if what not in ("step_mfu", "fp8_matmul"):
        raise ConfigError(f"gpu_speed.measure measures 'step_mfu' or 'fp8_matmul', not {what!r}.")
    return gpus.in_fresh_process("ppkit.lessons.gpu_speed", what, timeout_s=timeout_s, **kwargs)
