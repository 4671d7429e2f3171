"""Lesson 10b, part 2: overlap when the model itself is split: FSDP2's prefetch, and TP's all-reduces.

    fsdp_step     one FSDP2 step under torch.profiler with forward / backward prefetch and
                  ``reshard_after_forward`` chosen, and the step's peak memory (MemTracker)
    fsdp_sweep    the settings side by side
    tp_step       one step of stacked tensor-parallel MLP blocks (notebook 10's hand-written layers)

FSDP2 all-gathers a layer's weights just before the layer runs. Prefetching issues the *next* layer's
all-gather while this one computes: one more layer's full weights held, less waiting. With
``reshard_after_forward=False`` the weights stay gathered from forward to backward: no all-gather in
backward, every layer's full weights held until then. TP's all-reduce sits between two layers: the next
layer needs its result, so nothing is left to compute while it runs. Only async TP hides TP's communication:
on GPUs with symmetric memory it fuses an all-gather with the matmul after it and a matmul with the
reduce-scatter after it, the collectives of TP with sequence parallelism; a plain all-reduce has neither.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ppkit import compat
from ppkit.lessons import overlap as ov
from ppkit.lessons import overlap_trace as ot
from ppkit.lessons import tensor_parallel as tp

FSDP_LAYERS, FSDP_WIDTH, FSDP_BATCH = 6, 384, 512
SETTINGS = (  # (label, forward prefetch, backward prefetch, reshard_after_forward)
    ("no prefetch", False, False, True),
    ("backward prefetch (FSDP2's default)", False, True, True),
    ("forward + backward prefetch", True, True, True),
    ("reshard_after_forward=False", False, True, False),
)


def shard_with_prefetch(model, world_size: int, forward_prefetch: bool, backward_prefetch: bool,
                        reshard_after_forward: bool, async_all_gather: bool = True):
    """Each Linear of ``model`` and then the whole model wrapped by ``fully_shard``; layer i prefetches layer
    i + 1's all-gather in forward, layer i - 1's in backward, when asked (explicit prefetching).
    ``async_all_gather``: the all-gathers as asynchronous work, which a CPU needs to overlap anything
    (``compat.set_fsdp_unshard_async``; GPUs overlap through streams instead).

    FSDP2 has no switch for "no backward prefetch": ``set_modules_to_backward_prefetch([])`` means "the
    default", which prefetches the previous layer (torch's ``FSDPState._pre_backward``). Without backward
    prefetch each layer is therefore told to prefetch itself: its weights are gathered before its own
    prefetch runs, so that unshard does nothing (an empty "FSDP::backward_prefetch" span on the timeline).
    The root ``model`` too: with parameters of its own (a final norm) it would prefetch the last Linear."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    layers = [m for m in model if isinstance(m, torch.nn.Linear)]
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for i, layer in enumerate(layers):
        layer.set_modules_to_forward_prefetch(layers[i + 1:i + 2] if forward_prefetch else [])
        layer.set_modules_to_backward_prefetch([layers[i - 1] if backward_prefetch and i else layer])
    if not backward_prefetch:
        model.set_modules_to_backward_prefetch([model])
    compat.set_fsdp_unshard_async(model, async_all_gather)
    return model


def fsdp_step(rank, world_size, forward_prefetch: bool = False, backward_prefetch: bool = True,
              reshard_after_forward: bool = True, layers: int = FSDP_LAYERS, width: int = FSDP_WIDTH,
              batch: int = FSDP_BATCH, warmup: int = 2) -> dict:
    """One FSDP2 step measured on this rank: ``trace`` (for ``overlap_trace.merged``) and ``peak_bytes``
    (MemTracker's peak of a step: parameters, gradients, activations and all-gather buffers together)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = shard_with_prefetch(ov.make_model(layers, width), world_size, forward_prefetch, backward_prefetch,
                                reshard_after_forward)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)

    def step():
        model.zero_grad()
        F.mse_loss(model(x), y).backward()

    step()
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")
    return {"trace": ot.profile_step(rank, step, warmup), "peak_bytes": int(sum(per["Total"] for per in peak.values()))}


def measure_fsdp(cluster, forward_prefetch: bool, backward_prefetch: bool, reshard_after_forward: bool,
                 layers: int = FSDP_LAYERS, width: int = FSDP_WIDTH, batch: int = FSDP_BATCH) -> dict:
    """One setting measured on every rank of ``cluster``: rank 0's breakdown (ms), its peak memory,
    all-gathers per step and how many of them were issued as a prefetch in forward and in backward
    (``forward_prefetches``, ``backward_prefetches``, read from the trace), the ``profile`` (a
    ``ppkit.Profile``) and its ``events``."""
    chosen = (forward_prefetch, backward_prefetch, reshard_after_forward)
    label = next((name for name, *flags in SETTINGS if tuple(flags) == chosen),
                 f"forward prefetch {'on' if forward_prefetch else 'off'}, backward prefetch "
                 f"{'on' if backward_prefetch else 'off'}, reshard_after_forward={reshard_after_forward}")
    per_rank = cluster.run(fsdp_step, forward_prefetch, backward_prefetch, reshard_after_forward, layers, width,
                           batch)
    prof = ot.merged(r["trace"] for r in per_rank)
    events = prof.events()
    gathers = [e for e in ot.collectives(events, 0) if e["name"] == "gloo:all_gather"]
    return {"setting": label, "forward_prefetch": forward_prefetch, "backward_prefetch": backward_prefetch,
            "reshard_after_forward": reshard_after_forward, "peak_bytes": per_rank[0]["peak_bytes"],
            "all_gathers": len(gathers), "forward_prefetches": len(ot.prefetched_all_gathers(events, 0, "forward")),
            "backward_prefetches": len(ot.prefetched_all_gathers(events, 0, "backward")), "profile": prof,
            "events": events, **ot.breakdown(events, 0)}


def fsdp_sweep(cluster, settings=SETTINGS, layers: int = FSDP_LAYERS, width: int = FSDP_WIDTH,
               batch: int = FSDP_BATCH) -> list[dict]:
    """``measure_fsdp`` for each of ``settings`` ((label, forward prefetch, backward prefetch, reshard))."""
    return [measure_fsdp(cluster, fwd, bwd, reshard, layers, width, batch) for _, fwd, bwd, reshard in settings]


def fsdp_table(rows) -> str:
    """The sweep as text: all-gathers per step, how many were prefetched (forward / backward), peak, times."""
    head = (f"{'setting':<38} {'all-gathers':>11} {'prefetch f/b':>12} {'peak MB':>8} {'step ms':>8} {'comm ms':>8} "
            f"{'overlapped':>10} {'exposed ms':>10}")
    return "\n".join([head] + [
        f"{r['setting']:<38} {r['all_gathers']:>11} {r['forward_prefetches']:>5} / {r['backward_prefetches']:<4} "
        f"{r['peak_bytes'] / 1e6:>8.2f} {r['step']:>8.1f} {r['comm']:>8.1f} {ov.overlap_fraction(r):>10.0%} "
        f"{r['exposed']:>10.1f}" for r in rows])


def tp_step(rank, world_size, blocks: int = 4, d_model: int = 256, hidden: int = 1024, tokens: int = 256,
            warmup: int = 2) -> dict:
    """``blocks`` tensor-parallel MLPs in a row (column- then row-parallel Linear, notebook 10's), one step
    measured: every block's forward ends in an all-reduce that the next block waits for."""
    log = tp.AllReduceLog()
    full = [tp.MLP(d_model, hidden, seed=i) for i in range(blocks)]
    model = torch.nn.Sequential(*[tp.ParallelMLP(m, rank, world_size, log) for m in full])
    x = torch.randn(tokens, d_model, generator=torch.Generator().manual_seed(0))  # the same input on every rank

    def step():
        model.zero_grad()
        model(x).square().mean().backward()

    step()
    per_step = len(log.calls)
    return {"trace": ot.profile_step(rank, step, warmup), "all_reduces": per_step}


def tp_measure(cluster, blocks: int = 4) -> dict:
    """``tp_step`` on every rank of ``cluster``: rank 0's breakdown (ms), all-reduces per step, the ``profile``
    and its ``events``."""
    per_rank = cluster.run(tp_step, blocks)
    prof = ot.merged(r["trace"] for r in per_rank)
    events = prof.events()
    return {"setting": f"TP, {blocks} MLP blocks", "all_reduces": per_rank[0]["all_reduces"], "profile": prof,
            "events": events, **ot.breakdown(events, 0)}
