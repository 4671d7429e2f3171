"""ppkit.lessons.gpus: the datasheet peak a GPU's MFU is measured against, the backend and device a rank picks, and
the kernel's view of the GPUs asked in a fresh interpreter. No GPU here: torch.cuda's answers are patched where a
rule depends on them (the GPU paths themselves run in scripts/gpu_check.py on a machine with one)."""

from __future__ import annotations

import pytest
import torch

from ppkit.errors import ConfigError
from ppkit.lessons import data_parallel, gpus


@pytest.mark.parametrize(("name", "gpu", "bf16_tflops", "fp8_tflops"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5, 1979),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5, 1513),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5, 1670.5),
    ("NVIDIA H200", "H200 SXM", 989.5, 1979),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5, 1670.5),
    ("NVIDIA A100-SXM4-80GB", "A100", 312, None),
    ("NVIDIA A100-PCIE-40GB", "A100", 312, None),
    ("NVIDIA L4", "L4", 121, 242.5),
])
def test_the_datasheet_peak_is_found_by_the_name_torch_gives(name, gpu, bf16_tflops, fp8_tflops):
    peak = gpus.datasheet_peak(name)
    assert peak.gpu == gpu and peak.bf16 == bf16_tflops * 1e12
    assert peak.fp8 == (fp8_tflops * 1e12 if fp8_tflops else None)
    assert peak.source.startswith("NVIDIA")


def test_a_t4_has_no_bf16_and_unknown_gpus_have_no_peak():
    t4 = gpus.datasheet_peak("Tesla T4")
    assert (t4.bf16, t4.fp16, t4.fp8) == (None, 65e12, None)
    # whole words only: an L40S is not an L4, a GH200 not an H200, an A10 not an A100
    assert [gpus.datasheet_peak(n) for n in ("NVIDIA L40S", "NVIDIA GH200 480GB", "NVIDIA A10", "")] == [None] * 4


def test_a_name_that_is_not_a_string_is_refused():
    with pytest.raises(ConfigError, match="torch.cuda.get_device_name"):
        gpus.datasheet_peak(0)


def _gpus_seen(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(("visible", "local_world_size", "backend"), [
    (0, 1, "gloo"), (1, 1, "nccl"), (1, 2, "gloo"), (2, 2, "nccl"), (2, 4, "gloo"), (8, 4, "nccl")])
def test_a_rank_takes_nccl_only_where_each_local_rank_has_a_gpu(monkeypatch, visible, local_world_size, backend):
    _gpus_seen(monkeypatch, visible)
    assert gpus.rank_backend(local_world_size) == backend


def test_a_gloo_rank_stays_on_the_cpu_and_asks_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail("set_device under gloo"))
    assert gpus.rank_device(1, "gloo") == torch.device("cpu")


def test_an_nccl_rank_takes_its_local_gpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert gpus.rank_device(1, "nccl") == torch.device("cuda", 1) and chosen == [1]


def test_without_gpus_the_kernel_asks_no_fresh_python(monkeypatch):
    _gpus_seen(monkeypatch, 0)
    monkeypatch.setattr(gpus, "in_fresh_process", lambda *a, **k: pytest.fail("a fresh Python without GPUs"))
    assert gpus.devices() == []


def test_with_gpus_the_kernel_asks_a_fresh_python(monkeypatch):
    _gpus_seen(monkeypatch, 2)  # here only: the fresh Python sees this machine, which has none
    asked, real = [], gpus.in_fresh_process
    monkeypatch.setattr(gpus, "in_fresh_process", lambda *a, **k: asked.append(a) or real(*a, **k))
    assert gpus.devices() == [] and asked == [("ppkit.lessons.gpus", "devices_in_this_process")]
    assert not torch.cuda.is_initialized()


def test_a_fresh_python_that_fails_says_why():
    with pytest.raises(ConfigError, match=r"no_such_function\(\) in a fresh Python .* failed with code 1: "
                                          r"AttributeError"):
        gpus.in_fresh_process("ppkit.lessons.gpus", "no_such_function")


def test_backend_auto_counts_gpus_without_cuda_in_the_kernel(monkeypatch):
    """ppkit.start's 'auto' runs in the kernel: it counts through device_count (NVML before CUDA is initialised),
    never is_available, whose cudaGetDeviceCount runs cuInit in the kernel."""
    from ppkit.cluster import worker_setup

    monkeypatch.setattr(torch.cuda, "is_available", lambda: pytest.fail("is_available in the kernel"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert worker_setup.resolve_backend("auto", 2) == "nccl" and worker_setup.resolve_backend("auto", 4) == "gloo"


@pytest.fixture(scope="module")
def cluster():
    import ppkit

    with ppkit.Cluster(2, "gloo", timeout=120) as started:
        yield started


def test_the_gpu_lessons_run_on_cpu_ranks_without_gpus(cluster):
    """02's and 03's GPU cells on this machine: each rank finds no GPU and stays on gloo and the CPU."""
    assert cluster.run(gpus.all_reduce_here) == ["gloo on cpu: [3.0, 3.0]"] * 2
    assert cluster.run(data_parallel.ddp_step_here) == ["gloo on cpu, gradients equal on every rank: True"] * 2


def test_08cs_gpu_measurements_say_plainly_that_there_is_no_gpu():
    from ppkit.lessons import gpu_speed

    for measure in (gpu_speed.step_mfu, gpu_speed.fp8_matmul):
        with pytest.raises(ConfigError, match="no GPU here"):
            measure()
    with pytest.raises(ConfigError, match="'step_mfu' or 'fp8_matmul', not 'mfu'"):
        gpu_speed.measure("mfu")
    with pytest.raises(ConfigError, match="step_mfu\\(\\) in a fresh Python .* no GPU here"):  # asked outside
        gpu_speed.measure("step_mfu", seq_len=16)


def _playing_a_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> list:
    """This CPU process plays a GPU named ``name``: torch.cuda's questions answered, ``.cuda()`` a no-op, and the
    autocast a step asks for recorded (the list returned) and run as no autocast at all."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, device=None: self)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, device=None, **kwargs: self)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: None)  # Adam asks
    asked = []
    monkeypatch.setattr(torch, "autocast", lambda device_type, dtype=None, **kw: asked.append((device_type, dtype))
                        or contextlib.nullcontext())
    return asked


@pytest.mark.parametrize(("name", "capability", "dtype", "half", "peak"), [
    ("Tesla T4", (7, 5), torch.float16, "fp16", 65e12),  # Colab's and Kaggle's GPU: no bf16 tensor cores
    ("NVIDIA H100 80GB HBM3", (9, 0), torch.bfloat16, "bf16", 989.5e12),
])
def test_a_step_s_mfu_uses_the_half_type_the_gpu_has(monkeypatch, name, capability, dtype, half, peak):
    from ppkit.lessons import gpu_speed

    asked = _playing_a_gpu(monkeypatch, name, capability)
    said = gpu_speed.step_mfu(seq_len=16, microbatch_size=2, repeats=1, d_model=32, heads=2, layers=1)
    assert asked and set(asked) == {("cuda", dtype)}
    assert (said["autocast"], said["peak"]) == (half, peak)
    assert said["MFU"] == pytest.approx(said["model_flops"] / said["seconds"] / peak)


@pytest.mark.parametrize(("name", "capability", "half"), [
    ("Tesla T4", (7, 5), ("fp16", torch.float16, 65e12)),
    ("NVIDIA A100-SXM4-80GB", (8, 0), ("bf16", torch.bfloat16, 312e12)),
    ("Tesla V100-SXM2-16GB", (7, 0), ("fp16", torch.float16, None)),  # not in the table: the capability decides
    ("NVIDIA A10", (8, 6), ("bf16", torch.bfloat16, None)),
])
def test_the_half_type_is_bf16_only_where_the_gpu_has_bf16_tensor_cores(name, capability, half):
    from ppkit.lessons import gpu_speed

    assert gpu_speed.half_precision(name, capability) == half


def test_each_gpu_is_measured_in_a_fresh_python_that_sees_only_that_gpu(monkeypatch):
    """``measure(..., device=i)`` gives the fresh Python the kernel's GPU i alone (CUDA_VISIBLE_DEVICES, mapped
    through the kernel's own): no GPU here, so its refusal says what it was given."""
    from ppkit.lessons import gpu_speed

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ConfigError, match=r"no GPU here .*CUDA_VISIBLE_DEVICES='1'"):
        gpu_speed.measure("step_mfu", device=1, seq_len=16)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    with pytest.raises(ConfigError, match=r"no GPU here .*CUDA_VISIBLE_DEVICES='6'"):
        gpu_speed.measure("fp8_matmul", device=1, n=16)
    with pytest.raises(ConfigError, match=r"device=2\): .* 2 GPUs .*CUDA_VISIBLE_DEVICES='4,6'"):
        gpu_speed.measure("fp8_matmul", device=2)
    with pytest.raises(ConfigError, match=r"device=-1"):
        gpu_speed.measure("fp8_matmul", device=-1)
