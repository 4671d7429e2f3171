"""What every rank of a communication benchmark runs: one operation, timed (see comm.py).

The time of an operation is the mean over ``iters`` runs after ``warmup`` runs, between two
barriers; NCCL's asynchronous calls are synchronised first. "tcp" times the same pattern as p2p
over a plain Python socket between ranks 0 and 1, the ceiling for gloo on one machine.
"""

from __future__ import annotations

import socket
import time

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError

OPS = ("p2p", "all_reduce", "all_gather", "broadcast")


def _device() -> torch.device:
    """NCCL moves GPU tensors (ppkit's workers have set their device already); gloo, CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync() -> None:
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        torch.cuda.synchronize()  # NCCL calls return before the GPU has finished


def _timed(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    _sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync()
    return (time.perf_counter() - start) / iters


def measure(rank, world_size, op: str, size: int, warmup: int, iters: int) -> dict:
    """Time ``op`` on ``size`` bytes on this rank (run through ``cluster.run``)."""
    if op not in OPS + ("tcp",):
        raise ConfigError(f"unknown benchmark operation {op!r}; choose from {', '.join(OPS + ('tcp',))}.")
    if op in ("p2p", "tcp") and world_size < 2:
        raise ConfigError(f"{op} needs at least 2 ranks (rank 0 sends to rank 1).")
    n = world_size
    if op == "tcp":
        seconds = _tcp(rank, size, warmup, iters)
        return {"op": op, "bytes": size, "seconds": seconds}
    numel = size // 4
    device = _device()
    if op == "all_gather":
        per_rank = size // (4 * n)
        inp, out = torch.ones(per_rank, device=device), torch.empty(per_rank * n, device=device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        seconds = _timed(lambda: gather(out, inp), warmup, iters)
        return {"op": op, "bytes": per_rank * n * 4, "seconds": seconds}
    buf = torch.ones(numel, device=device)
    if op == "all_reduce":
        seconds = _timed(lambda: dist.all_reduce(buf), warmup, iters)
    elif op == "broadcast":
        seconds = _timed(lambda: dist.broadcast(buf, src=0), warmup, iters)
    else:
        seconds = _p2p(rank, buf, warmup, iters)
    return {"op": op, "bytes": numel * 4, "seconds": seconds}


def _p2p(rank: int, buf: torch.Tensor, warmup: int, iters: int) -> float:
    """Rank 0 sends ``iters`` messages to rank 1, which acknowledges the last one."""
    ack = torch.zeros(1, device=buf.device)

    def burst(count):
        for _ in range(count):
            if rank == 0:
                dist.send(buf, dst=1)
            elif rank == 1:
                dist.recv(buf, src=0)
        if rank == 0:
            dist.recv(ack, src=1)
        elif rank == 1:
            dist.send(ack, dst=0)

    burst(warmup)
    _sync()
    dist.barrier()
    start = time.perf_counter()
    burst(iters)
    _sync()
    return (time.perf_counter() - start) / iters


def _tcp(rank: int, size: int, warmup: int, iters: int) -> float:
    """The same pattern as ``_p2p`` over one plain loopback socket between ranks 0 and 1."""
    port = torch.zeros(1, dtype=torch.int64)
    listener = conn = None
    if rank == 0:
        listener = socket.create_server(("127.0.0.1", 0))
        port[0] = listener.getsockname()[1]
    dist.broadcast(port, src=0)
    try:
        if rank == 0:
            conn, _ = listener.accept()
        elif rank == 1:
            conn = socket.create_connection(("127.0.0.1", int(port)))
        if conn is not None:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = bytearray(b"\x01") * size if rank in (0, 1) else None  # written memory, like torch.ones
        view = memoryview(data) if data is not None else None

        def burst(count):
            if rank == 0:
                for _ in range(count):
                    conn.sendall(view)
                _recv_exactly(conn, memoryview(bytearray(1)))
            elif rank == 1:
                for _ in range(count):
                    _recv_exactly(conn, view)
                conn.sendall(b"k")

        burst(warmup)
        dist.barrier()
        start = time.perf_counter()
        burst(iters)
        return (time.perf_counter() - start) / iters
    finally:
        for s in (conn, listener):
            if s is not None:
                s.close()


def _recv_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)  # one wake-up, not hundreds
        if n == 0:
            raise ConnectionError("the sending rank closed the benchmark socket early")
        got += n
