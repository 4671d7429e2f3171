"""Lesson 13, the links: each kind of collective timed over groups of n ranks, at two sizes, as latency and bandwidth.

    Link            one kind of collective over groups of n ranks: its latency per call and its bandwidth
    ring_bytes      the bytes one rank sends per call with a ring algorithm (NCCL's ring; gloo's reduce_scatter is
                    an all_reduce underneath and sends more, see ``Link``)
    link_buffers    the input and output of one timed call
    link_call       one call of a kind over a group
    measure_links   all_reduce, all_gather, reduce_scatter and send/recv timed on a cluster, every group of the
                    world at once (as in a step: all ranks busy), at two sizes; latency and bandwidth from the two
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError
from ppkit.lessons import composition as comp
from ppkit.lessons.zero import _all_gather, _reduce_scatter  # torch 2.14's names where they exist

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
SIZES = (1024, 1 << 18)  # bytes per rank: latency dominates the first, bandwidth the second
@dataclass(frozen=True)
class Link:
    kind: str
    n: int                 # ranks per group
    latency_s: float       # seconds per call of SIZES[0] bytes (the bytes' own time is negligible there)
    # bytes per second per rank, counting the bytes a ring algorithm sends (``ring_bytes``: what NCCL's ring sends),
    # from the two sizes (inf if the larger was no slower). gloo's reduce_scatter is not a ring: torch 2.14's
    # ProcessGroupGloo runs it as an all_reduce of the whole tensor and copies the rank's part out (profiled, a
    # gloo:all_reduce under c10d::_reduce_scatter_base_), so its link carries about twice these bytes
    bytes_per_s: float


def ring_bytes(kind: str, nbytes: int, n: int) -> float:
    """Bytes one rank sends for one call over ``n`` ranks whose input is ``nbytes`` per rank, with ring algorithms
    (as NCCL's ring sends them and ``composition_measure.CommLog`` counts them; gloo's reduce_scatter is an
    all_reduce underneath, see ``Link``): an all_gather's input is a rank's shard, a reduce_scatter's
    the whole tensor it reduces."""
    return {"all_reduce": 2 * (n - 1) / n * nbytes, "all_gather": (n - 1) * nbytes,
            "reduce_scatter": (n - 1) / n * nbytes, "send_recv": nbytes}[kind]


def link_buffers(kind: str, nbytes: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) of one timed call of ``kind`` over ``n`` ranks with an input of about ``nbytes`` (float32;
    a reduce_scatter's input rounded down to a multiple of n elements): ``ring_bytes(kind, input.nbytes, n)`` is
    what the call sends."""
    numel = nbytes // 4
    if kind == "reduce_scatter":
        numel -= numel % n
        return torch.ones(numel), torch.empty(numel // n)
    return torch.ones(numel), torch.empty(numel * n if kind == "all_gather" else 0)


def _group(world_size: int, n: int):
    """A process group of ``n`` neighbouring ranks, every rank in one: the last dimension of mesh
    (world / n, 1, n), made once per worker by ``comp.device_mesh`` (notebook 13 has made it already)."""
    return comp.device_mesh((world_size // n, 1, n))["tp"].get_group()


def link_call(kind: str, group, x: torch.Tensor, out: torch.Tensor):
    """One call of ``kind`` over ``group`` from input ``x`` into ``out`` (as ``link_buffers`` makes them)."""
    if kind == "all_reduce":
        dist.all_reduce(x, group=group)
    elif kind == "all_gather":
        _all_gather(out, x, group=group)
    elif kind == "reduce_scatter":
        _reduce_scatter(out, x, group=group)
    else:  # a send to the neighbour and its answer back: one call each way, timed as two
        me = dist.get_rank(group)
        peer = dist.get_global_rank(group, me ^ 1)
        first, second = (dist.send, dist.recv) if me % 2 == 0 else (dist.recv, dist.send)
        first(x, peer)
        second(x, peer)


def _link_times(rank, world_size, groups=(2, 4), sizes=SIZES, reps: int = 5) -> dict:
    """Seconds per call, (kind, n, bytes) -> seconds, on this rank; every group of n ranks runs at once."""
    times = {}
    for n in groups:
        group = _group(world_size, n)
        for kind in KINDS:
            for nbytes in sizes:
                x, out = link_buffers(kind, nbytes, n)
                link_call(kind, group, x, out)  # warm-up: gloo sets up the pair's buffers on first use
                dist.barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    link_call(kind, group, x, out)
                times[kind, n, nbytes] = (time.perf_counter() - start) / reps / (2 if kind == "send_recv" else 1)
    return times


def measure_links(cluster, groups=(2, 4), sizes=SIZES, reps: int = 5) -> dict[tuple[str, int], Link]:
    """(kind, n) -> Link, from the slowest rank's mean of ``reps`` calls at each of the two ``sizes``."""
    bad = [n for n in groups if not isinstance(n, int) or n < 2 or cluster.world_size % n]
    if bad:
        raise ConfigError(f"groups {bad}: each group size must be a whole number from 2 up that divides the "
                          f"cluster's {cluster.world_size} ranks, so that every rank is in one group; try (2, 4).")
    per_rank = cluster.run(_link_times, groups=groups, sizes=sizes, reps=reps)
    links = {}
    for n in groups:
        for kind in KINDS:
            small, large = (max(r[kind, n, s] for r in per_rank) for s in sizes)
            small_in, large_in = (link_buffers(kind, s, n)[0].nbytes for s in sizes)
            extra = ring_bytes(kind, large_in, n) - ring_bytes(kind, small_in, n)
            links[kind, n] = Link(kind, n, small, extra / (large - small) if large > small else float("inf"))
    return links
