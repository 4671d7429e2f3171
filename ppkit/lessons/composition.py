"""Lesson 13: data, pipeline and tensor parallelism composed on one 3-D device mesh ("dp", "pp", "tp").

    Size           the tiny transformer's sizes and the batch (a frozen dataclass)
    Transformer    embedding, pre-norm blocks (causal attention by heads, an MLP), final norm, head
    check_mesh     refuses a mesh the world or the model cannot take, saying which value and what would work
    device_mesh    the mesh, over all ranks or the first few of them
    build_stage    this rank's pipeline stage: its blocks, each tensor-parallel over "tp" (DTensor
                   ``parallelize_module``), then sharded over "dp" with FSDP2 ``fully_shard``
    train_step     one step on the mesh (torch.distributed.pipelining's GPipe over "pp"), then Adam
    reference_step the same step in one process, on the whole batch

A stage keeps the full model's parameter names (the blocks it does not hold are deleted), so each of
its gradients is compared with the same name in the one-process model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ppkit.errors import ConfigError

DIMS = ("dp", "pp", "tp")
LR = 1e-2


@dataclass(frozen=True)
class Size:
    vocab: int = 32
    d_model: int = 16
    heads: int = 4
    ffn: int = 64
    layers: int = 4
    batch: int = 8            # sequences per step, over all dp ranks
    seq: int = 8              # tokens per sequence
    microbatches: int = 2     # per dp rank, through the pipeline

    def params(self) -> int:
        """Parameters of the whole model: embedding, blocks (2 norms, q k v o, fc1 fc2), norm, head."""
        d, f = self.d_model, self.ffn
        block = 2 * 2 * d + 4 * (d * d + d) + (d * f + f) + (f * d + d)
        return self.vocab * d + self.layers * block + 2 * d + d * self.vocab + self.vocab


SIZE = Size()  # the lesson's model


class Block(nn.Module):
    def __init__(self, size: Size):
        super().__init__()
        d = size.d_model
        self.head_dim = d // size.heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, size.ffn), nn.Linear(size.ffn, d)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.norm1(x)
        # -1 heads: under tensor parallelism q, k, v hold only this rank's heads
        q, k, v = (p(h).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.o(a)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Transformer(nn.Module):
    """The whole model, or (after ``keep_stage``) one pipeline stage of it."""

    def __init__(self, size: Size = SIZE, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(size.vocab, size.d_model)
        self.layers = nn.ModuleDict({str(i): Block(size) for i in range(size.layers)})
        self.norm, self.head = nn.LayerNorm(size.d_model), nn.Linear(size.d_model, size.vocab)

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            h = layer(h)
        return self.head(self.norm(h)) if self.head is not None else h

    def keep_stage(self, stage: int, stages: int) -> Transformer:
        """Delete what stage ``stage`` of ``stages`` does not run: it keeps its share of the blocks, the
        first stage the embedding, the last the final norm and head. Names stay as in the whole model."""
        per = len(self.layers) // stages
        for i in list(self.layers):
            if not stage * per <= int(i) < (stage + 1) * per:
                del self.layers[i]
        if stage > 0:
            self.embed = None
        if stage < stages - 1:
            self.norm = self.head = None
        return self


def batch(size: Size, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token targets, the same on every machine."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, size.vocab, (size.batch, size.seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def shapes(world_size: int, size: Size = SIZE, problem=None) -> list[tuple[int, int, int]]:
    """Every (dp, pp, tp) with dp x pp x tp = world_size that the model and batch can take (``problem(world_size,
    mesh, size)``: what is wrong with a mesh, or None; default: this lesson's model's)."""
    problem = problem or _problem
    return [(dp, pp, world_size // (dp * pp)) for dp in range(1, world_size + 1) for pp in range(1, world_size + 1)
            if world_size % (dp * pp) == 0 and problem(world_size, (dp, pp, world_size // (dp * pp)), size) is None]


def _problem(world_size: int, mesh, size: Size) -> str | None:
    if len(mesh) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) for n in mesh):
        return f"the mesh must be three whole numbers (dp, pp, tp), got {mesh!r}"
    dp, pp, tp = mesh
    if min(mesh) < 1:
        return f"every degree must be at least 1, got dp={dp}, pp={pp}, tp={tp}"
    if dp * pp * tp != world_size:
        return (f"mesh {dp}x{pp}x{tp} has {dp * pp * tp} ranks, but the world has {world_size}: "
                "dp x pp x tp must equal the world size")
    if size.layers % pp:
        return f"pp={pp} cannot split the {size.layers} blocks evenly into stages: pp must divide {size.layers}"
    if size.heads % tp or size.ffn % tp:
        return (f"tp={tp} cannot split {size.heads} heads and an MLP of {size.ffn} evenly: tp must divide "
                f"{size.heads}")
    if size.batch % (dp * size.microbatches):
        return (f"dp={dp} cannot split a batch of {size.batch} sequences into {size.microbatches} micro-batches "
                f"per rank: dp x {size.microbatches} must divide {size.batch}")
    return None


def check_world(world_size, available: int) -> int:
    """``world_size`` when the cluster's ``available`` ranks can hold it; a ConfigError saying what can."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or not 1 <= world_size <= available:
        raise ConfigError(f"world size {world_size!r}: the mesh runs on ranks 0 .. world size - 1 of this cluster, "
                          f"which has {available}; pick a whole number from 1 to {available} (or start a bigger "
                          "cluster).")
    return world_size


def check_mesh(world_size: int, mesh, size: Size = SIZE, problem=None) -> tuple[int, int, int]:
    """``mesh`` as a (dp, pp, tp) tuple, or a ConfigError saying what is wrong and which meshes would work
    (``problem`` as in ``shapes``)."""
    mesh = tuple(mesh) if isinstance(mesh, (tuple, list)) else (mesh,)
    wrong = (problem or _problem)(world_size, mesh, size)
    if wrong:
        ok = ", ".join("x".join(map(str, s)) for s in shapes(world_size, size, problem)) or "none"
        raise ConfigError(f"{wrong}. Meshes (dp x pp x tp) that work for {world_size} ranks: {ok}.")
    return mesh


def device_mesh(mesh):
    """The 3-D mesh of ranks 0 .. dp x pp x tp - 1, as ``init_device_mesh`` lays them out, the last dimension
    fastest. Every rank of the world must call it (making a process group takes them all), also those
    left out (their ``get_coordinate()`` is None); made once per shape in each worker."""
    from torch.distributed.device_mesh import DeviceMesh

    if mesh not in _MESHES:
        _MESHES[mesh] = DeviceMesh("cpu", torch.arange(mesh[0] * mesh[1] * mesh[2]).view(mesh), mesh_dim_names=DIMS)
    return _MESHES[mesh]


_MESHES: dict = {}


def build_stage(mesh3d, size: Size = SIZE, seed: int = 0, shard_dp: bool = True) -> Transformer:
    """This rank's stage: tensor parallel over "tp", then FSDP2 over "dp" (a degree of 1 is left out; with
    ``shard_dp=False`` each dp rank keeps a whole replica, and ``train_step`` all_reduces the gradients)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    stage = Transformer(size, seed).keep_stage(mesh3d["pp"].get_local_rank(), mesh3d["pp"].size())
    if mesh3d["tp"].size() > 1:
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel(),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
        for block in stage.layers.values():
            parallelize_module(block, mesh3d["tp"], plan)
    if shard_dp and mesh3d["dp"].size() > 1:
        for block in stage.layers.values():
            fully_shard(block, mesh=mesh3d["dp"])
        fully_shard(stage, mesh=mesh3d["dp"])
    return stage


def my_batch(mesh3d, size: Size):
    """This dp rank's share of the batch: every pp and tp rank of a dp row gets the same sequences."""
    x, y = batch(size)
    per = size.batch // mesh3d["dp"].size()
    mine = slice(mesh3d["dp"].get_local_rank() * per, (mesh3d["dp"].get_local_rank() + 1) * per)
    return x[mine].clone(), y[mine].clone()  # copies: autograd keeps the ids of this rank's sequences only


def train_step(mesh3d, stage: Transformer, size: Size = SIZE, shard_dp: bool = True):
    """Forward and backward of this rank's share, then Adam; returns (loss, optimizer). The loss is the
    last stage's mean over its micro-batches (None on other stages)."""
    loss = _forward_backward(mesh3d, stage, size)
    if not shard_dp and mesh3d["dp"].size() > 1:  # replicas: average the gradients as in notebook 03
        for p in stage.parameters():
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(grad, group=mesh3d["dp"].get_group())
            grad /= mesh3d["dp"].size()
    opt = torch.optim.Adam(stage.parameters(), lr=LR, foreach=False)
    opt.step()
    return loss, opt


def _forward_backward(mesh3d, stage: Transformer, size: Size) -> float | None:
    """GPipe over "pp" with ``size.microbatches`` micro-batches (one plain step when pp is 1)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    x, y = my_batch(mesh3d, size)
    pp, s = mesh3d["pp"].size(), mesh3d["pp"].get_local_rank()
    if pp == 1:
        loss = loss_fn(stage(x), y)
        loss.backward()
        return loss.item()
    mb = x.shape[0] // size.microbatches
    hidden = torch.empty(mb, size.seq, size.d_model, requires_grad=True)
    # the shapes given up front (requires_grad: a gradient comes back): no shape-finding messages
    logits = torch.empty(mb, size.seq, size.vocab, requires_grad=True)
    pipe = PipelineStage(stage, s, pp, torch.device("cpu"), input_args=x[:mb] if s == 0 else hidden,
                         output_args=logits if s == pp - 1 else hidden, group=mesh3d["pp"].get_group())
    schedule = ScheduleGPipe(pipe, n_microbatches=size.microbatches, loss_fn=loss_fn)
    losses: list[torch.Tensor] = []
    if s == 0:
        schedule.step(x)
    elif s == pp - 1:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return torch.stack(losses).mean().item() if losses else None


def reference_step(size: Size = SIZE, seed: int = 0) -> tuple[float, Transformer]:
    """One process, the whole batch: the loss and the model holding its gradients."""
    model = Transformer(size, seed)
    x, y = batch(size)
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item(), model
