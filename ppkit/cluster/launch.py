"""Choosing a backend and starting the fork server (zygote) that makes local workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from ppkit.errors import ConfigError

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
    iface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": iface, "TP_SOCKET_IFNAME": iface, "MASTER_ADDR": "127.0.0.1"}


def start_zygote(address: tuple[str, int], key: bytes, log_path: Path) -> subprocess.Popen:
    """Start the fork server in its own session, so Kernel > Interrupt does not reach it."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(PPKIT_ADDR=f"{address[0]}:{address[1]}", PPKIT_KEY=key.hex(),
               PPKIT_PARENT=str(os.getpid()), PYTHONUNBUFFERED="1")
    # OpenMP threads that finish early spin-wait for the others by default. With more workers
    # than cores, a spinning thread steals the core its partner needs: a pipeline forward that
    # takes 0.1 s took 2-4 s on 2 cores. Passive waiting sleeps instead. Read once, at torch import.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "ppkit.transport.zygote"],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    finally:
        log.close()
