"""scripts/gpu_check.py's evidence that a notebook used a GPU, from nvidia-smi's samples. No GPU here: the samples
are given as nvidia-smi prints them (the script runs on a machine with one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pids_are_the_evidence_where_nvidia_smi_sees_them(gpu_check):
    said = gpu_check.gpu_evidence({"4242, 812 MiB"}, {0: 3, 1: 3}, {0: 815, 1: 3})
    assert said.startswith("pids (nvidia-smi --query-compute-apps): 4242, 812 MiB")


def test_in_a_container_the_memory_used_per_gpu_is_the_evidence(gpu_check):
    """A container's own PID namespace: nvidia-smi lists no compute app, but each GPU's memory.used still rises."""
    said = gpu_check.gpu_evidence(set(), {0: 3, 1: 5}, {0: 1027, 1: 5})
    assert said == ("memory.used (no pid visible: nvidia-smi --query-compute-apps saw none, as in a container's "
                    "own PID namespace): GPU 0 rose by 1024 MiB")


def test_nothing_seen_is_said_with_what_was_looked_at(gpu_check):
    said = gpu_check.gpu_evidence(set(), {0: 3}, {0: 40})
    assert said == "none seen (no pid; memory.used rose by less than 64 MiB on every GPU)"
    assert gpu_check.gpu_evidence(set(), {}, {}) == "none seen (no pid; nvidia-smi gave no memory.used)"


def test_nvidia_smi_s_memory_lines_are_read_per_gpu(gpu_check):
    assert gpu_check.memory_used_mib("0, 3\n1, 1027\n\n") == {0: 3, 1: 1027}
    assert gpu_check.memory_used_mib("No devices were found\n") == {}
