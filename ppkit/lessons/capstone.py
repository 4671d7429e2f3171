"""Lesson 14, the capstone: a small Llama (ppkit.models.llama) trained on shipped text (ppkit.data), first in one
process, then on a device mesh composed with torch's own APIs, as notebooks 09-13 taught them.

    Run           the run's settings: model sizes, sequences per step, micro-batches and schedule, lr, seed
    batch_at      step ``step``'s sequences and next-byte targets, the same on every machine
    reference     the one-process run: fp32, Adam, a loss per step
    TOLERANCE     how far a parallel run's loss may be from the reference's (relative): see ``tolerance``
    check_mesh    refuses a (dp, pp, tp) mesh the world or the model cannot take, saying what would work
    parallelize   this rank's stage: tensor parallel with sequence parallel over "tp" (DTensor), FSDP2 over "dp"
    train         (on every rank) steps ``start`` .. ``start + steps`` on the mesh, pipelined over "pp"; can save
                  and load a torch.distributed.checkpoint (capstone_checkpoint)
    layout        how this rank holds its first block's wq: each mesh dimension's placement, the local shape
    train_on      ``train`` on a cluster, the mesh checked once in the kernel first; each rank's result
    run_mesh      ``train_on``'s losses combined into one per step
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ppkit import data
from ppkit.errors import ConfigError
from ppkit.lessons import capstone_checkpoint as ckpt
from ppkit.lessons import composition as comp
from ppkit.lessons.composition_measure import _quiet as quiet
from ppkit.models import llama
from ppkit.parity import ParityRecorder
from ppkit.pipeline.schedules.stage import SCHEDULES, step_once
from ppkit.transport.metrics import log_metrics


@dataclass(frozen=True)
class Run:
    config: llama.Config = field(default_factory=llama.Config)
    batch: int = 8            # sequences per step, over all dp ranks
    microbatches: int = 2     # per dp rank, through the pipeline (when pp > 1)
    schedule: str = "gpipe"   # the pipeline's schedule (when pp > 1): "gpipe" or "1f1b", the same losses
    lr: float = 3e-3
    seed: int = 0

    @property
    def tokens(self) -> int:
        """Tokens trained on per step."""
        return self.batch * self.config.seq


RUN = Run()
_TOKENS: list[torch.Tensor] = []  # the shipped text, encoded once per process


def batch_at(run: Run, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``run.batch`` windows of the text at offsets drawn from (seed, step): ids and the next bytes."""
    if not _TOKENS:
        _TOKENS.append(data.encode(data.text()))
    tokens, seq = _TOKENS[0], run.config.seq
    g = torch.Generator().manual_seed(1_000_003 * run.seed + step)
    starts = torch.randint(0, len(tokens) - seq - 1, (run.batch,), generator=g)
    window = torch.stack([tokens[s:s + seq + 1] for s in starts.tolist()])
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def optimizer(params, run: Run) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=run.lr, foreach=False)  # foreach=False: one DTensor at a time


def reference(run: Run = RUN, steps: int = 8, recorder=None) -> list[float]:
    """The one-process run: the whole batch each step, fp32, Adam; the loss of each step. ``recorder``: a
    ``ppkit.ParityRecorder`` that records each step's loss and gradients."""
    model = llama.Llama(run.config, run.seed)
    opt = optimizer(model.parameters(), run)
    losses = []
    for step in range(steps):
        x, y = batch_at(run, step)
        loss = loss_fn(model(x), y)
        loss.backward()
        if recorder is not None:
            recorder.record(step, model, loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


# A rough worst case, not a proof (notebook 14, section 4): fp32 rounds each addition by up to u = 2^-24; a sum of n
# terms in another order moves by up to n u (Higham, ch. 4), 256 u = 1.5e-5 for a step's 256 tokens; Adam does not
# damp the differences, so ten steps give 1.5e-4, rounded up. Runs longer than ten steps are measured, not derived.
# The loss cannot see a gradient scaled by a constant (a dp sum where a mean belongs): Adam divides it out, and the
# loss moves by about 1e-6 (2x the gradients: 1.5e-6 over ten steps). The gradients are compared for that, by name
# (ppkit.compare_runs, with its own tolerance per tensor).
TOLERANCE = 2e-4


def tolerance(run: Run = RUN, steps: int = 10) -> float:
    """The bound TOLERANCE is rounded from: steps x (tokens per step) x fp32's unit roundoff."""
    return steps * run.tokens * 2.0 ** -24


def _problem(world_size: int, mesh, run: Run) -> str | None:
    if len(mesh) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) for n in mesh):
        return f"the mesh must be three whole numbers (dp, pp, tp), got {mesh!r}"
    dp, pp, tp = mesh
    c = run.config
    if min(mesh) < 1:
        return f"every degree must be at least 1, got dp={dp}, pp={pp}, tp={tp}"
    if dp * pp * tp != world_size:
        return f"mesh {dp}x{pp}x{tp} has {dp * pp * tp} ranks, but {world_size} run it: dp x pp x tp must equal it"
    if c.layers % pp:
        return f"pp={pp} cannot split {c.layers} blocks evenly into stages"
    if c.heads % tp or c.hidden % tp or c.seq % tp:
        return (f"tp={tp} must divide the {c.heads} heads, the MLP's {c.hidden} and (sequence parallel) the "
                f"{c.seq} tokens of a sequence")
    m = run.microbatches if pp > 1 else 1
    if run.batch % (dp * m):
        return f"dp={dp} x {m} micro-batches must divide the batch of {run.batch} sequences"
    if run.schedule not in SCHEDULES:
        return f"schedule={run.schedule!r} is not one of {', '.join(SCHEDULES)}"
    return None


def shapes(world_size: int, run: Run = RUN) -> list[tuple[int, int, int]]:
    """Every (dp, pp, tp) of ``world_size`` ranks that the model and batch can take."""
    return comp.shapes(world_size, run, _problem)


def check_mesh(world_size: int, mesh, run: Run = RUN) -> tuple[int, int, int]:
    """``mesh`` as a (dp, pp, tp) tuple, or a ConfigError saying what is wrong and which meshes work."""
    return comp.check_mesh(world_size, mesh, run, _problem)


def tp_plan(first: bool, last: bool) -> dict:
    """Tensor parallel with sequence parallel (torchtitan's Llama plan): between blocks the activations are split on
    the sequence (Shard(1)); each attention and MLP all_gathers them (PrepareModuleInput), runs its heads or its slice
    of the MLP (Colwise), and reduce_scatters its output back onto the sequence (Rowwise, output Shard(1))."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    block = {"attention_norm": SequenceParallel(), "attention": PrepareModuleInput(**gather),
             "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
             "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
             "ffn_norm": SequenceParallel(), "feed_forward": PrepareModuleInput(**gather),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
             "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}
    outer = {}
    if first:  # each rank holds a slice of the vocabulary (rows, Shard(0)): a token not in it looks up zeros, and
        # the partial sums are reduce_scattered onto the sequence
        outer["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if last:
        outer["norm"] = SequenceParallel()
        outer["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return {"block": block, "outer": outer}


def parallelize(mesh3d, run: Run = RUN) -> llama.Llama:
    """This rank's stage of the model: tensor and sequence parallel over "tp", then FSDP2 over "dp" (a degree of 1
    is left out)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    pp, stage_index = mesh3d["pp"].size(), mesh3d["pp"].get_local_rank()
    stage = llama.Llama(run.config, run.seed).keep_stage(stage_index, pp)
    if mesh3d["tp"].size() > 1:
        plan = tp_plan(stage_index == 0, stage_index == pp - 1)
        for block in stage.layers.values():
            parallelize_module(block, mesh3d["tp"], plan["block"])
        parallelize_module(stage, mesh3d["tp"], plan["outer"])
    if mesh3d["dp"].size() > 1:
        for block in stage.layers.values():
            fully_shard(block, mesh=mesh3d["dp"])
        fully_shard(stage, mesh=mesh3d["dp"])
    return stage


def _my_batch(mesh3d, run: Run, step: int):
    x, y = batch_at(run, step)
    per = run.batch // mesh3d["dp"].size()
    mine = slice(mesh3d["dp"].get_local_rank() * per, (mesh3d["dp"].get_local_rank() + 1) * per)
    return x[mine].clone(), y[mine].clone()


def _schedule(mesh3d, stage, run: Run, per_rank: int):
    """This rank's PipelineStage and its schedule over "pp" (``run.schedule``, torch.distributed.pipelining), the
    activations' shapes given up front: a stage's hidden state is its sequence-parallel slice, seq / tp tokens."""
    from torch.distributed.pipelining import PipelineStage

    pp, s, c = mesh3d["pp"].size(), mesh3d["pp"].get_local_rank(), run.config
    mb = per_rank // run.microbatches
    hidden = torch.empty(mb, c.seq // mesh3d["tp"].size(), c.dim, requires_grad=True)
    logits = torch.empty(mb, c.seq, c.vocab, requires_grad=True)
    tokens = torch.zeros(mb, c.seq, dtype=torch.long)
    pipe = PipelineStage(stage, s, pp, torch.device("cpu"), input_args=tokens if s == 0 else hidden,
                         output_args=logits if s == pp - 1 else hidden, group=mesh3d["pp"].get_group())
    return pipe, SCHEDULES[run.schedule](pipe, n_microbatches=run.microbatches, loss_fn=loss_fn)


def _step(mesh3d, stage, pipeline, run: Run, step: int) -> float | None:
    x, y = _my_batch(mesh3d, run, step)
    if pipeline is None:
        loss = loss_fn(stage(x), y)
        loss.backward()
        return loss.item()
    losses = step_once(*pipeline, x, y)  # notebook 08's: each stage feeds what it holds
    return torch.stack(losses).mean().item() if losses else None


def train(rank, world_size, mesh=(2, 1, 2), run: Run = RUN, steps: int = 4, start: int = 0, ranks: int | None = None,
          load: str | None = None, save: str | None = None, metrics: bool = False, parity: bool = False) -> dict | None:
    """Steps ``start`` .. ``start + steps - 1`` on ``mesh`` (dp, pp, tp) over ranks 0 .. ``ranks`` - 1 (default:
    all; the others return None). ``load``: first restore model and Adam from that checkpoint (any mesh's);
    ``save``: afterwards save them there. ``metrics``: report loss and tokens/s each step (``ppkit.log_metrics``:
    a live plot under the cell); ``parity``: record each step's loss and gradients (``ppkit.ParityRecorder``).
    Returns this rank's coordinates, loss per step (last stage; else None), seconds per step, its ``layout`` and
    the recorded run (None without ``parity``)."""
    ranks = world_size if ranks is None else comp.check_world(ranks, world_size)
    mesh = check_mesh(ranks, mesh, run)
    mesh3d = comp.device_mesh(mesh)  # every rank of the world takes part in making its groups
    group = ckpt.ranks_group(ranks, world_size) if load or save else None
    if rank >= ranks:
        return None
    stage = parallelize(mesh3d, run)
    opt = optimizer(stage.parameters(), run)
    if load:
        ckpt.load(load, stage, opt, group)
    pipeline = _schedule(mesh3d, stage, run, run.batch // mesh[0]) if mesh[1] > 1 else None
    losses, seconds = [], []
    recorder = ParityRecorder() if parity else None
    with quiet():  # lesson 13's: FSDP2's notice that the root returns a view, DTensor's about two all_gathers
        for step in range(start, start + steps):
            _train_step(mesh3d, stage, opt, pipeline, run, step, recorder, losses, seconds, metrics)
    if save:
        ckpt.save(save, stage, opt, group)
    return {"rank": rank, "coords": tuple(mesh3d[d].get_local_rank() for d in comp.DIMS), "losses": losses,
            "seconds": seconds, "layout": layout(stage), "parity": recorder.run if recorder else None}


def layout(stage) -> dict:
    """How this rank holds its first block's ``attention.wq`` weight: ``placements`` by mesh dimension (tp's
    ``Shard(dim=0)``: its heads' rows; FSDP2's over dp) and the ``local`` shape (a plain tensor: {} and all of it)."""
    weight = next(iter(stage.layers.values())).attention.wq.weight
    if not hasattr(weight, "placements"):
        return {"placements": {}, "local": tuple(weight.shape)}
    names = weight.device_mesh.mesh_dim_names
    return {"placements": dict(zip(names, map(repr, weight.placements))), "local": tuple(weight.to_local().shape)}


def _train_step(mesh3d, stage, opt, pipeline, run: Run, step: int, recorder, losses: list, seconds: list,
                metrics: bool) -> None:
    began = time.perf_counter()
    losses.append(_step(mesh3d, stage, pipeline, run, step))
    if recorder is not None:  # the loss of a dp rank's own sequences: their mean over dp is the step's
        recorder.record(step, stage, losses[-1], mean_over=_last_stage_dp(mesh3d))
    opt.step()
    opt.zero_grad()
    seconds.append(time.perf_counter() - began)
    if metrics:
        loss = {} if losses[-1] is None else {"loss": losses[-1]}
        log_metrics(step=step, tokens_per_s=run.tokens / seconds[-1], **loss)


def _last_stage_dp(mesh3d):
    """The dp group of a last stage (its ranks each hold their sequences' loss), None on other stages."""
    return mesh3d["dp"].get_group() if mesh3d["pp"].get_local_rank() == mesh3d["pp"].size() - 1 else None


def combine(results: list) -> list[float]:
    """One loss per step from the ranks' results: the last stage's, averaged over dp (tp ranks hold the same)."""
    last = [r["losses"] for r in results if r is not None and r["coords"][2] == 0 and r["losses"][0] is not None]
    return [sum(step) / len(step) for step in zip(*last)]


def train_on(cluster, mesh, run: Run = RUN, ranks: int | None = None, timeout: float = 600, **options) -> list:
    """``train`` on the cluster's first ``ranks`` ranks (default: all), ``options`` passed on (steps, start, load,
    save, metrics, parity); each rank's result. The mesh is checked here, once, before any rank starts: a bad one
    is one ConfigError in the kernel, not a traceback from every rank."""
    ranks = comp.check_world(cluster.world_size if ranks is None else ranks, cluster.world_size)
    try:
        check_mesh(ranks, mesh, run)
    except ConfigError as err:
        raise ConfigError(f"{err} (ranks={ranks} of this cluster's {cluster.world_size}: ranks= says how many of "
                          f"its first ranks run the mesh, dp x pp x tp of them, at most {cluster.world_size})") from err
    return cluster.run(train, mesh=tuple(mesh), run=run, ranks=ranks, timeout=timeout, **options)


def run_mesh(cluster, mesh, run: Run = RUN, steps: int = 4, start: int = 0, ranks: int | None = None,
             load: str | None = None, save: str | None = None, timeout: float = 600) -> list[float]:
    """``train_on`` the cluster's first ``ranks`` ranks; the loss of each step."""
    return combine(train_on(cluster, mesh, run, ranks, timeout, steps=steps, start=start, load=load, save=save))
