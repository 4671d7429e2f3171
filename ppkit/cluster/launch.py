"""Checking a world size, choosing a backend, and the socket environment of local workers."""

from __future__ import annotations

import socket

from ppkit.errors import ConfigError
from ppkit.transport import ifaces

BACKENDS = ("auto", "gloo", "nccl")


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ConfigError(
            f"world_size must be a whole number of workers, got {world_size!r} "
            f"({type(world_size).__name__}). Try ppkit.start(2)."
        )
    if world_size < 1:
        raise ConfigError(
            f"world_size must be at least 1, got {world_size}. A process group needs one rank "
            "or more; ppkit.start(2) is the smallest world where ranks can talk."
        )
    return world_size


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend: str, world_size: int, gpus: int | None = None) -> str:
    """``auto`` means nccl when every local rank can have its own GPU, else gloo."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ConfigError(
            f"unknown backend {backend!r}. ppkit supports {', '.join(BACKENDS)}: 'gloo' runs "
            "on CPUs everywhere, 'nccl' needs one GPU per rank, 'auto' picks for you."
        )
    if backend == "gloo":
        return backend  # no GPU count needed, so no torch import in the kernel
    gpus = gpu_count() if gpus is None else gpus
    if backend == "auto":
        return "nccl" if gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        raise ConfigError(
            f"backend 'nccl' needs one GPU per rank: {world_size} ranks but {gpus} GPU(s) "
            "visible here. Use backend='gloo' (CPU) or backend='auto', or fewer ranks."
        )
    return backend


def loopback_interface() -> str:
    """The name of the loopback interface ('lo' on Linux, 'lo0' on macOS)."""
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    return "lo"


def local_env() -> dict[str, str]:
    """Keep gloo and TensorPipe on loopback, whatever the hostname resolves to."""
    return {**ifaces.socket_env(loopback_interface()), "MASTER_ADDR": "127.0.0.1"}
