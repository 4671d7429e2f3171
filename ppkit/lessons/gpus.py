"""GPUs for the lessons that use them when present: the backend and device a rank takes, the GPUs of this machine as
the kernel may ask for them, and the datasheet peak that a GPU's MFU is measured against.

The kernel never initialises CUDA: a rank decides for itself (``rank_backend``, ``rank_device``), and
the kernel's view of the GPUs (``devices``) counts them through NVML (``torch.cuda.device_count`` before CUDA is
initialised) and asks a fresh interpreter for their names, so that no CUDA context lands in the kernel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass

import torch

from ppkit.cluster import worker_setup
from ppkit.errors import ConfigError

TERA = 1e12


@dataclass(frozen=True)
class DatasheetPeak:
    """A GPU's dense tensor-core peak in FLOP/s, as NVIDIA's datasheet gives it (None: the GPU has no such
    tensor cores). Datasheets print the Hopper, Ampere and Ada figures "with sparsity" (2:4 structured), twice
    the dense rate that a training step can reach; these are the dense ones, half the printed number."""

    gpu: str
    bf16: float | None
    fp16: float
    fp8: float | None
    source: str


_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100): SXM/PCIe/NVL columns"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200): H200 SXM/H200 NVL columns"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100): BF16/FP16 Tensor Core"
_L4 = "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4)"
_T4 = "NVIDIA T4 datasheet (nvidia.com/en-us/data-center/tesla-t4): mixed precision (FP16/FP32), no BF16 or FP8"

# Most specific first: a name is matched against the first entry whose words it all has ("H100 PCIe" before "H100").
PEAKS = (
    (("H100", "PCIE"), DatasheetPeak("H100 PCIe", 756.5 * TERA, 756.5 * TERA, 1513 * TERA, _H100)),
    (("H100", "NVL"), DatasheetPeak("H100 NVL", 835.5 * TERA, 835.5 * TERA, 1670.5 * TERA, _H100)),
    (("H100",), DatasheetPeak("H100 SXM", 989.5 * TERA, 989.5 * TERA, 1979 * TERA, _H100)),
    (("H200", "NVL"), DatasheetPeak("H200 NVL", 835.5 * TERA, 835.5 * TERA, 1670.5 * TERA, _H200)),
    (("H200",), DatasheetPeak("H200 SXM", 989.5 * TERA, 989.5 * TERA, 1979 * TERA, _H200)),
    (("A100",), DatasheetPeak("A100", 312 * TERA, 312 * TERA, None, _A100)),
    (("L4",), DatasheetPeak("L4", 121 * TERA, 121 * TERA, 242.5 * TERA, _L4)),
    (("T4",), DatasheetPeak("T4", None, 65 * TERA, None, _T4)),
)


def datasheet_peak(device_name: str) -> DatasheetPeak | None:
    """The datasheet peak of the GPU that ``torch.cuda.get_device_name`` calls ``device_name``, or None for a GPU
    not in the table (then MFU needs a measured peak).

    >>> datasheet_peak("NVIDIA H100 80GB HBM3").bf16 / 1e12
    989.5
    """
    if not isinstance(device_name, str):
        raise ConfigError(f"datasheet_peak wants a device name such as torch.cuda.get_device_name() gives "
                          f"('NVIDIA H100 80GB HBM3'), got {type(device_name).__name__} {device_name!r:.60}.")
    words = set(re.split(r"[^A-Z0-9]+", device_name.upper()))  # "L4" is a word of "NVIDIA L4", not of "L40S"
    for needed, peak in PEAKS:
        if words.issuperset(needed):
            return peak
    return None


def rank_backend(local_world_size: int) -> str:
    """In a rank: 'nccl' where each of this machine's ``local_world_size`` ranks can have a GPU of its own, else
    'gloo' (ppkit.start's 'auto' rule, asked here rather than in the kernel)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return worker_setup.resolve_backend("auto", local_world_size, gpus=gpus)


def rank_device(local_rank: int, backend: str) -> torch.device:
    """In a rank: its GPU (``cuda:local_rank``, made current) under nccl, else the CPU."""
    if backend != "nccl":
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def devices_in_this_process() -> list[dict]:
    """Every GPU this process sees: name, compute capability and datasheet peak (initialises CUDA here)."""
    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(i)
        peak = datasheet_peak(name)
        found.append({"index": i, "name": name, "capability": list(torch.cuda.get_device_capability(i)),
                      "datasheet_peak": asdict(peak) if peak else None})
    return found


def devices(timeout_s: float = 120.0) -> list[dict]:
    """The GPUs of this machine, asked as the kernel may ask: none (an empty list, at once) where
    ``torch.cuda.device_count()`` says none (NVML's count; torch falls back to cudaGetDeviceCount, a cuInit without
    a context, only where NVML fails), else ``devices_in_this_process`` run in a fresh interpreter, whose CUDA
    context ends with it."""
    if worker_setup.gpu_count() == 0:
        return []
    return in_fresh_process("ppkit.lessons.gpus", "devices_in_this_process", timeout_s=timeout_s)


def in_fresh_process(module: str, function: str, timeout_s: float = 120.0, env: dict | None = None, **kwargs):
    """``module.function(**kwargs)`` run in a fresh interpreter (exec'd, not forked: it may initialise CUDA), with
    ``env`` added to this process's environment there; its JSON result returned; a failure raises ConfigError with
    the interpreter's last words."""
    code = (f"import json, sys, {module} as m; "
            f"print('PPKIT-RESULT ' + json.dumps(m.{function}(**json.loads(sys.argv[1]))))")
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"{module}.{function}() in a fresh Python did not finish within {timeout_s:.0f} s. "
                          "A busy machine may need more: pass timeout_s.") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("PPKIT-RESULT ")]
    if done.returncode != 0 or not lines:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"{module}.{function}() in a fresh Python ({sys.executable}) failed with code "
                          f"{done.returncode}: {said}. Run it in a terminal to see all of it.")
    return json.loads(lines[-1].removeprefix("PPKIT-RESULT "))


# -- what a rank runs: 02's all_reduce on GPUs where each rank has one, else on the CPU (03's: data_parallel.py) ---

def all_reduce_here(rank: int, world_size: int) -> str:
    """02 on GPUs: an all_reduce over ``rank_backend``'s choice, made in this rank (nccl: its GPU's tensor, else a
    CPU tensor over gloo); says which, and the sum."""
    import torch.distributed as dist

    backend = rank_backend(world_size)  # every rank of these lessons is on this machine
    device = rank_device(rank, backend)
    group = dist.new_group(backend=backend)
    t = torch.full((2,), float(rank + 1), device=device)
    dist.all_reduce(t, group=group)
    dist.destroy_process_group(group)
    return f"{backend} on {device.type}: {t.tolist()}"

