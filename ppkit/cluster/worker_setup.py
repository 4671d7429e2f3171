"""What every launcher needs: a checked world size, a backend, the configuration and socket
environment of a worker, and a rendezvous store on a network address."""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta

from ppkit.errors import ConfigError
from ppkit.transport import ifaces
from ppkit.transport.messages import JoinConfig

BACKENDS = ("auto", "gloo", "nccl")
MAX_RANKS_PER_CORE = 64  # a sanity bound on world_size (a typo such as 2000 for 2), not a tuned limit


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
    limit = MAX_RANKS_PER_CORE * (os.cpu_count() or 1)
    if world_size > limit:
        raise ConfigError(
            f"world_size {world_size} is more than {MAX_RANKS_PER_CORE} ranks per CPU core of this machine "
            f"({limit} for {os.cpu_count() or 1} core(s)): each rank is a process holding torch (hundreds "
            "of MB), so this would exhaust memory rather than teach anything. Use a few ranks, e.g. "
            "ppkit.start(4).")
    return world_size


def gpu_count() -> int:
    """GPUs visible here, asked as the kernel may ask: ``device_count`` counts through NVML and leaves CUDA alone
    (falling back to cudaGetDeviceCount only where NVML fails), where ``is_available`` always calls
    cudaGetDeviceCount, which runs cuInit in the kernel and arms torch's fork poisoning (torch 2.14's torch/cuda)."""
    import torch

    return torch.cuda.device_count()


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


def worker_config(rank: int, world_size: int, backend: str, process_group: bool, env: dict,
                  join_timeout: float, threads: int | None = None) -> JoinConfig:
    """What a worker on this machine is told when it joins (a launcher adds the store).
    ``threads``: its torch threads (its share of the CPU budget), None to leave torch's default."""
    return JoinConfig(
        rank=rank, world_size=world_size, backend=backend, process_group=process_group, threads=threads,
        device=f"cuda:{rank}" if backend == "nccl" else "cpu",
        # the kernel's sys.path too, so functions imported from modules the notebook can
        # import (sys.path.append("..") in a cell, pytest's test dirs) unpickle on the workers
        env=dict(env), cwd=os.getcwd(), sys_path=(os.getcwd(), *filter(None, sys.path)),
        join_timeout=join_timeout, pg_timeout=1800.0,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tcp_store(host: str, world_size: int, timeout: float, port: int = 0, multi_tenant: bool = False):
    """A TCPStore served by this process on ``host`` only, on ``port`` (0: any free one; the
    store's ``.port`` says which).

    Given a host and a port, torch's TCPStore server still listens on every interface, so it is
    handed a socket bound here instead. ``multi_tenant``: a later ``TCPStore(host, port,
    is_master=True, multi_tenant=True)`` in this process (what ``init_process_group`` and
    ``init_rpc`` make for ``tcp://``/``env://``) reuses this server rather than binding its own.
    """
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server does
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    # the bound port, not 0: torch files a multi-tenant server under its port, and only looks
    # there (dropping a stale entry of an earlier store on that port) when given one
    port = sock.getsockname()[1]
    return dist.TCPStore(host, port, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout), master_listen_fd=sock.detach(),
                         multi_tenant=multi_tenant)


def loopback_interface() -> str:
    """The name of the loopback interface ('lo' on Linux, 'lo0' on macOS)."""
    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    return "lo"


def local_env() -> dict[str, str]:
    """Keep gloo and TensorPipe on loopback, whatever the hostname resolves to."""
    return {**ifaces.socket_env(loopback_interface()), "MASTER_ADDR": "127.0.0.1"}
