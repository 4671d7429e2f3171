"""Lesson 10b, overlap: DDP's gradient buckets, all-reduced while backward still runs, seen on a timeline.

    ddp_step          one DDP step on this rank under torch.profiler, and the buckets DDP launched, in order
    no_overlap_step   the same step as notebook 03's hand-written DP: backward first, then every all-reduce
    bucket_sweep      ddp_step for several ``bucket_cap_mb``, each against the no-overlap step

DDP hands the gradients to the all-reduce in buckets of about ``bucket_cap_mb``. Backward produces the
last layer's gradients first, so DDP fills its buckets in reverse parameter order and launches bucket 0,
the last layers', while backward is still working on the first ones. (Its very first step has a single
bucket: DDP then rebuilds them in the order the gradients became ready.) The measuring and the interval
arithmetic are in ``overlap_trace``; FSDP2's prefetch and TP's all-reduces in ``overlap_sharded``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppkit.errors import ConfigError
from ppkit.lessons import data_parallel as dp
from ppkit.lessons import overlap_trace as ot

LAYERS, WIDTH, BATCH = 6, 320, 256
# DDP's default: bucket_cap_mb left out (None), a first bucket of 1 MiB, then buckets of 25 MiB. Passing 25
# explicitly is not the default: every bucket, the first included, is then 25 MiB (torch's
# BucketCapacityConfig). For this 2.4 MiB model: the default makes 2 buckets, 25 one.
DDP_DEFAULT = "DDP's default"
CAPS_MB = (0.05, 0.5, 1.0, DDP_DEFAULT, 25.0)  # 0.05: a bucket per weight; 25: one bucket for this model


def make_mlp(widths, seed: int = 0) -> nn.Sequential:
    """Linear(widths[0], widths[1]), ReLU, Linear(widths[1], widths[2]), ...: parameter names "0.weight",
    "0.bias", "2.weight", ... (the ReLUs take the odd places)."""
    widths = list(widths)
    if len(widths) < 2 or any(not isinstance(w, int) or w < 1 for w in widths):
        raise ConfigError(f"an MLP needs at least two widths, each a positive int (input, ..., output); got "
                          f"{widths!r}.")
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        mods += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    return nn.Sequential(*mods)


def make_model(layers: int = LAYERS, width: int = WIDTH, seed: int = 0) -> nn.Sequential:
    """``layers`` Linear(width, width) with a ReLU between them: the model the timelines measure."""
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError(f"layers must be a positive int, got {layers!r}.")
    return make_mlp([width] * (layers + 1), seed)


def param_sizes(model: nn.Module) -> list[tuple[str, int]]:
    """(name, bytes) of every parameter, in ``model.named_parameters()`` order: what the exercise gets."""
    return [(name, p.numel() * p.element_size()) for name, p in model.named_parameters()]


def _batch(rank: int, width: int, batch: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def _check_cap(bucket_cap_mb) -> None:
    if bucket_cap_mb == DDP_DEFAULT:
        return
    if not isinstance(bucket_cap_mb, (int, float)) or isinstance(bucket_cap_mb, bool) or not bucket_cap_mb > 0:
        raise ConfigError(f"bucket_cap_mb must be a positive number of MiB, or "
                          f"ppkit.lessons.overlap.DDP_DEFAULT for DDP's default (a first bucket of 1 MiB, then "
                          f"25 MiB ones); got {bucket_cap_mb!r}.")


def _setting(bucket_cap_mb) -> str:
    if bucket_cap_mb == DDP_DEFAULT:
        return "DDP, default (bucket_cap_mb=None)"
    return f"DDP, bucket_cap_mb={bucket_cap_mb:g}"


def ddp_noting_buckets(model: nn.Module, bucket_cap_mb: float | str):
    """``model`` in DDP with its default all-reduce hook, noting each bucket it launches: ``launched`` gets
    a new list per step (the step appends it), each bucket as ``{"index", "params", "bytes"}``.
    ``bucket_cap_mb``: MiB, or ``DDP_DEFAULT`` to leave it out (DDP's own None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    _check_cap(bucket_cap_mb)
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = DDP(model, bucket_cap_mb=None if bucket_cap_mb == DDP_DEFAULT else bucket_cap_mb)
    launched: list[list[dict]] = []

    def note_then_all_reduce(process_group, bucket):
        buffer = bucket.buffer()
        launched[-1].append({"index": bucket.index(), "params": [names[id(p)] for p in bucket.parameters()],
                             "bytes": buffer.numel() * buffer.element_size()})
        return default_hooks.allreduce_hook(process_group, bucket)

    ddp.register_comm_hook(None, note_then_all_reduce)
    return ddp, launched


def ddp_buckets(rank, world_size, widths, bucket_cap_mb: float, steps: int = 2) -> list[list[str]]:
    """The parameter names of each DDP bucket of ``make_mlp(widths)``, in the order DDP launched their
    all-reduce in step ``steps`` (from step 2 on, after DDP rebuilt its buckets)."""
    model = make_mlp(widths)
    ddp, launched = ddp_noting_buckets(model, bucket_cap_mb)
    x = torch.randn(4, widths[0], generator=torch.Generator().manual_seed(rank))
    for _ in range(steps):
        launched.append([])
        ddp(x).square().mean().backward()
    return [b["params"] for b in launched[-1]]


def ddp_step(rank, world_size, bucket_cap_mb: float | str = DDP_DEFAULT, layers: int = LAYERS, width: int = WIDTH,
             batch: int = BATCH, warmup: int = 2, own_profiler: bool = True) -> dict:
    """One DDP step measured on this rank (after ``warmup`` steps), with its buckets.

    Returns ``trace`` (this rank's, for ``overlap_trace.merged``; None with ``own_profiler=False``, inside
    ``cluster.profile()``, whose profile then holds the steps), ``buckets``: the measured
    step's buckets in the order DDP launched their all-reduce, each ``{"index", "params", "bytes"}`` as a
    communication hook saw it, and ``first_step_buckets``: the same for the very first step."""
    model = make_model(layers, width)
    ddp, launched = ddp_noting_buckets(model, bucket_cap_mb)
    x, y = _batch(rank, width, batch)

    def step():
        launched.append([])
        ddp.zero_grad()
        loss = F.mse_loss(ddp(x), y)
        loss.backward()  # DDP waits for its last bucket here, at the end of backward

    trace = ot.profile_step(rank, step, warmup, own_profiler=own_profiler)
    return {"trace": trace, "buckets": launched[-1], "first_step_buckets": launched[0],
            "params": [n for n, _ in model.named_parameters()]}


def no_overlap_step(rank, world_size, layers: int = LAYERS, width: int = WIDTH, batch: int = BATCH,
                    warmup: int = 2) -> dict:
    """The same step as notebook 03 wrote it: backward, then one all-reduce per gradient
    (``data_parallel.average_gradients``). Nothing to overlap with: every all-reduce waits for backward."""
    model = make_model(layers, width)
    x, y = _batch(rank, width, batch)

    def step():
        model.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        dp.average_gradients(model)

    return {"trace": ot.profile_step(rank, step, warmup)}


def measure_ddp(cluster, bucket_cap_mb: float | str | None, layers: int = LAYERS, width: int = WIDTH,
                batch: int = BATCH) -> dict:
    """One setting measured on every rank of ``cluster``: DDP with ``bucket_cap_mb`` (MiB, or ``DDP_DEFAULT``),
    or with None the no-overlap step. A row: ``setting``, ``bucket_cap_mb``, ``buckets`` (all-reduces per
    step), rank 0's breakdown in ms (``overlap_trace.breakdown``), the ``profile`` (a ``ppkit.Profile``: its
    timeline, its summary) and its ``events``."""
    if bucket_cap_mb is None:
        per_rank = cluster.run(no_overlap_step, layers, width, batch)
        setting, buckets = "no overlap (notebook 03)", 2 * layers  # one all-reduce per weight and bias
    else:
        _check_cap(bucket_cap_mb)
        per_rank = cluster.run(ddp_step, bucket_cap_mb, layers, width, batch)
        setting, buckets = _setting(bucket_cap_mb), len(per_rank[0]["buckets"])
    prof = ot.merged(r["trace"] for r in per_rank)
    events = prof.events()
    return {"setting": setting, "bucket_cap_mb": bucket_cap_mb, "buckets": buckets, "profile": prof,
            "events": events, **ot.breakdown(events, 0)}


def bucket_sweep(cluster, caps_mb=CAPS_MB, layers: int = LAYERS, width: int = WIDTH, batch: int = BATCH) -> list[dict]:
    """``measure_ddp`` for each cap, then the no-overlap step: one row per setting."""
    for cap in caps_mb:
        _check_cap(cap)
    return [measure_ddp(cluster, cap, layers, width, batch) for cap in (*caps_mb, None)]


def overlap_fraction(row: dict) -> float:
    """The share of a step's communication that ran while compute ran (0 when there was none)."""
    return row["overlapped"] / row["comm"] if row["comm"] else 0.0


def sweep_table(rows) -> str:
    """The sweep as text: one line per setting."""
    head = f"{'setting':<34} {'buckets':>7} {'step ms':>8} {'comm ms':>8} {'overlapped':>10} {'exposed ms':>10}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['setting']:<34} {r['buckets']:>7} {r['step']:>8.1f} {r['comm']:>8.1f} "
                     f"{overlap_fraction(r):>10.0%} {r['exposed']:>10.1f}")
    return "\n".join(lines)
