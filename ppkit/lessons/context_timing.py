"""Lesson 11, measured: what each rank of the ring computed and waited for, forward and backward.

    m = measure(cluster, seq_len=4096, ranks=4, sharding="zigzag", causal=True)
    m.compute_s        CPU seconds each rank spent computing (thread time: its own work, however
                       busy the machine was; the least over the repeats, since noise only adds)
    m.wait_s           wall seconds each rank waited for K/V or dK/dV that had not arrived yet
    m.step_s           the slowest rank's forward + backward, wall time
    m.imbalance        slowest rank's compute / the mean
    plot_timeline(m)   who computed and who waited, when;  plot_work(a, b)  per rank, two shardings

``measure(..., comm=False)`` runs the very same steps with the K/V blocks already in place (nothing
sent): the compute-only time that a ring which hides its communication should match. Every rank
computes with one thread (a core per rank, as a GPU per rank would be). Settings are checked in the
kernel before anything runs, so a refused one leaves the cluster as it was.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppkit.errors import ConfigError
from ppkit.lessons import timeline
from ppkit.lessons.context_parallel import Layout, inputs, layout, ring_group, whole_number, work_formula
from ppkit.lessons.ring_attention import NoComm, Ring, Work, ring_attention


def _measure_job(rank, world_size, k, seq_len, sharding, causal, heads, head_dim, comm, repeats):
    group = ring_group(k)
    if rank >= k:
        return None
    lay = layout(seq_len, k, sharding)
    q, key, value, upstream = inputs(seq_len, heads, head_dim)
    blocks = [torch.stack([lay.shard(key, r), lay.shard(value, r)]) for r in range(k)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    runs = []
    try:
        for _ in range(repeats + 1):  # the first warms up allocations and connections
            mine = [lay.shard(t, rank).requires_grad_() for t in (q, key, value)]
            ring = Ring(group) if comm else NoComm(rank, blocks)
            tl, work = timeline.Timeline(rank), Work()
            dist.barrier(group)
            start = time.monotonic()
            out = ring_attention(*mine, lay, causal, ring=ring, timeline=tl, work=work)
            (out * lay.shard(upstream, rank)).sum().backward()
            runs.append({"step_s": time.monotonic() - start, "spans": tl.spans, "work": work.seconds})
    finally:
        torch.set_num_threads(threads)
    return runs[1:]


@dataclass
class Measurement:
    """One measured forward + backward of ring attention. ``spans`` and ``steps`` come from the repeat
    whose slowest rank was fastest; ``work`` is each rank's least compute over the repeats."""

    layout: Layout
    causal: bool
    comm: bool
    spans: list           # per rank: timeline spans
    work: list            # per rank: {"forward": s, "backward": s} of compute CPU time
    steps: list           # per rank: wall seconds of its forward + backward

    @property
    def compute_s(self) -> list[float]:
        return [w["forward"] + w["backward"] for w in self.work]

    @property
    def wait_s(self) -> list[float]:
        return [sum(s["end"] - s["start"] for s in spans if s["kind"] == "comm") for spans in self.spans]

    @property
    def step_s(self) -> float:
        return max(self.steps)

    @property
    def imbalance(self) -> float:
        return max(self.compute_s) / statistics.mean(self.compute_s)

    @property
    def counted(self) -> list[int]:
        return work_formula(self.layout, self.causal)

    def title(self) -> str:
        lay = self.layout
        return (f"{lay.sharding}, {'causal' if self.causal else 'no mask'}, {lay.seq_len} tokens over "
                f"{lay.world_size} ranks{'' if self.comm else ', compute only'}")

    def summary(self) -> str:
        per_rank = ", ".join(f"{c * 1e3:.0f}" for c in self.compute_s)
        waits = ", ".join(f"{w * 1e3:.0f}" for w in self.wait_s)
        return (f"{self.title()}: step {self.step_s * 1e3:.0f} ms; compute per rank {per_rank} ms "
                f"(slowest / mean = {self.imbalance:.2f}); waited {waits} ms")


def check_settings(seq_len, ranks, sharding, world_size: int) -> Layout:
    """The layout for these settings, or a ConfigError saying which value is impossible and what works."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= world_size:
        raise ConfigError(f"ranks={ranks!r}: the cluster has {world_size} ranks, so the ring can use 1 to "
                          f"{world_size} of them; pick one of those (or start a larger cluster).")
    return layout(seq_len, ranks, sharding)


def measure(cluster, seq_len: int = 4096, ranks: int | None = None, sharding: str = "zigzag",
            causal: bool = True, heads: int = 4, head_dim: int = 64, comm: bool = True,
            repeats: int = 1, timeout: float = 120) -> Measurement:
    """Run ring attention forward and backward on ranks 0..ranks-1 of ``cluster`` and measure it."""
    ranks = cluster.world_size if ranks is None else ranks
    lay = check_settings(seq_len, ranks, sharding, cluster.world_size)
    for name, value in (("heads", heads), ("head_dim", head_dim), ("repeats", repeats)):
        whole_number(name, value)
    results = cluster.run(_measure_job, ranks, seq_len, sharding, bool(causal), heads, head_dim, bool(comm),
                          repeats, timeout=timeout)[:ranks]
    best = min(range(repeats), key=lambda i: max(r[i]["step_s"] for r in results))
    least = [min((run["work"] for run in r), key=lambda w: w["forward"] + w["backward"]) for r in results]
    return Measurement(lay, bool(causal), bool(comm), [r[best]["spans"] for r in results], least,
                       [r[best]["step_s"] for r in results])


# -- pictures -----------------------------------------------------------------------------------

def plot_timeline(m: Measurement):
    """Gantt chart of one measured step: compute (green) and waits (orange) per rank, forward then backward."""
    return timeline.plot(m.spans, title=m.title())


def plot_work(*measurements: Measurement):
    """Per rank: the scores counted by the formula and the compute CPU seconds measured, one bar
    group per measurement (e.g. contiguous and zig-zag under the same causal mask)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.4))
    counted, measured = fig.subplots(1, 2)
    width = 0.8 / len(measurements)
    for n, m in enumerate(measurements):
        ranks = range(m.layout.world_size)
        xs = [r + (n - (len(measurements) - 1) / 2) * width for r in ranks]
        label = f"{m.layout.sharding}{'' if m.causal else ' (no mask)'}"
        counted.bar(xs, [c / 1e6 for c in m.counted], width, label=label)
        measured.bar(xs, [c * 1e3 for c in m.compute_s], width, label=f"{label}: slowest/mean {m.imbalance:.2f}")
    for ax, title, unit in ((counted, "work counted", "million scores"),
                            (measured, "work measured (forward + backward)", "CPU ms")):
        ax.set_xticks(range(measurements[0].layout.world_size),
                      [f"rank {r}" for r in range(measurements[0].layout.world_size)])
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
