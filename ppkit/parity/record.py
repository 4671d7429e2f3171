"""What a rank records for a parity check: its loss and its gradients (or parameters) by name, each as the
piece of the full tensor this rank holds, with where that piece lies.

A piece's place comes from what the rank has: a DTensor says it (its mesh coordinate and placements, read
with the function torch's checkpointing uses, ``compute_local_shape_and_global_offset``: no collective for
Shard, Replicate and FSDP2 x TP's strided shard), a tensor the learner split by hand says it through
``shards={name: (dim, index, count)}`` (torch.chunk's piece) or ``{name: (dim, slice(start, stop))}`` (any other
cut), and anything else is the whole tensor. Each tensor also keeps the precision it was computed in
(precision.py), for the tolerance it is compared with. The recorder makes no
collective call except where the learner asks for one (``mean_over``) or a DTensor's placement cannot be read
as a box of the full tensor (Partial; a strided shard whose rows are not consecutive): then every rank of its
mesh calls ``redistribute`` or ``full_tensor`` at the same record call, as ranks that record the same model do.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from ppkit.errors import ConfigError
from ppkit.parity.loss_value import group_size, loss_value
from ppkit.parity.precision import EPS, Seen
from ppkit.parity.precision import name as precision_name

KINDS = ("grads", "params")
# wrappers that add a component to a parameter's name without changing what it is (torch.compile, FSDP1,
# activation checkpointing); DDP's "module." only as the first component
_WRAPPERS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


@dataclass(frozen=True)
class Piece:
    """One rank's part of a named tensor. ``value`` is None for a gradient the rank did not have. Where it
    lies: ``offset`` (per dim) in a tensor of ``full_shape`` (from a DTensor), or ``chunk`` = (dim, index,
    count), ``torch.chunk``'s piece ``index`` (declared by the learner), or neither: the whole tensor.
    ``gathered``: the rank built the whole tensor with a collective, so it is not this rank's own piece.
    ``offset`` without ``full_shape``: a box the learner declared (``shards={name: (dim, slice(start, stop))}``).
    ``dtype``: the precision the value was computed in ("torch.bfloat16" for a float32 gradient under autocast)."""

    value: torch.Tensor | None
    offset: tuple[int, ...] | None = None
    full_shape: tuple[int, ...] | None = None
    chunk: tuple[int, int, int] | None = None
    gathered: bool = False
    dtype: str = ""


@dataclass
class ParityRun:
    """What one rank (or the one-process reference) recorded: losses and named pieces, by step."""

    rank: int
    world_size: int
    kind: str                                   # "grads" or "params"
    losses: dict[int, float] = field(default_factory=dict)
    tensors: dict[int, dict[str, Piece]] = field(default_factory=dict)   # step -> name (in model order) -> piece
    loss_dtypes: dict[int, str] = field(default_factory=dict)  # step -> the precision its loss was computed in
    computed: dict[int, str] = field(default_factory=dict)  # step -> a lower precision seen for the whole step
    precision: dict[str, str] = field(default_factory=dict)    # each precision seen -> why (for the report)
    dp_size: int | None = None                  # the size of mean_over's group: the data-parallel ranks
    graphs: dict[int, str] = field(default_factory=dict)  # step -> the least precise dtype its loss's graph shows
    # the parameters at the first step recorded with a model (what='grads'; with 'params' they are the record):
    # the weights the run started from, which tell a seed per rank from other data
    start: dict[str, Piece] = field(default_factory=dict)
    start_step: int | None = None
    own_losses: dict[int, float] = field(default_factory=dict)  # step -> this rank's own loss, before mean_over
    # a one-process run recording parameters keeps its gradients too: where they are zero but for rounding, Adam's
    # update is float32's rounding divided by itself (amplified.py)
    step_grads: dict[int, dict[str, Piece]] = field(default_factory=dict)
    # step -> the parameters recorded with requires_grad=False (frozen): backward gives them no gradient and the
    # optimizer does not move them, which the record alone would read as a detached stage or a skipped step
    frozen: dict[int, list[str]] = field(default_factory=dict)

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.losses) | set(self.tensors))


def clean_name(name: str) -> str:
    """The name a plain one-process model gives the same parameter: wrappers' components left out."""
    for wrapper in _WRAPPERS:
        name = name.replace(wrapper, "")
    return name.removeprefix("module.")


class ParityRecorder:
    """Records, at each step, a rank's loss and its gradients (``what="grads"``, after backward and before the
    optimizer's step) or parameters (``what="params"``) by name, for ``ppkit.compare_runs``.

        rec = ppkit.ParityRecorder()                # on each rank, and the same in the kernel for the reference
        for step in range(steps):
            loss = loss_fn(model(x), y); loss.backward()
            rec.record(step, model, loss, mean_over=dp_group)   # the loss averaged over data-parallel ranks
            opt.step(); opt.zero_grad()
        return rec.run                              # what cluster.run hands back to the kernel

    ``shards``: {name: (dim, index, count)} for a tensor split by hand with torch.chunk (rank r of a
    tensor-parallel group of n holding rows r: ``(0, r, n)``), or {name: (dim, slice(start, stop))} for a piece
    cut otherwise (``tensor_split``, uneven sizes); ``rename``: a dict or a function from this model's names to the
    reference's (a pipeline stage that numbers its layers from 0, say). DTensors need neither. ``precision``: the
    dtype the run computed in, where the recorder cannot see it (an autocast region that ended before ``record``
    with the loss passed as a number); autocast on at the record call, a loss tensor's graph, FSDP2's
    MixedPrecisionPolicy and TF32 on a GPU it sees by itself. The tolerance follows it.

    Every recorded tensor travels back to the kernel with the run: for a large model, record the loss at every step
    (``record(step, None, loss)``) and the tensors at a few steps only. Recording gradients, it also keeps the
    parameters of the first step it records with a model (one copy of this rank's pieces): the weights the run
    started from, which tell a rank built from another seed from one that saw other data.
    """

    def __init__(self, what: str = "grads", shards: Mapping | None = None,
                 rename: Mapping[str, str] | Callable[[str], str] | None = None, precision=None):
        if what not in KINDS:
            raise ConfigError(f"ParityRecorder(what={what!r}): record 'grads' (after backward, before the "
                              "optimizer's step: a bug shows at its own step) or 'params'.")
        self.shards = {name: _shard_spec(name, spec) for name, spec in dict(shards or {}).items()}
        self.precision = "" if precision is None else precision_name(precision)
        if self.precision and self.precision not in EPS:
            raise ConfigError(f"ParityRecorder(precision={precision!r}): give the dtype the run computed in, one of "
                              f"{', '.join(EPS)}.")
        self.rename = rename
        initialized = dist.is_available() and dist.is_initialized()
        rank, size = (dist.get_rank(), dist.get_world_size()) if initialized else (0, 1)
        self.run = ParityRun(rank, size, what)

    def record(self, step: int, model=None, loss=None, *, mean_over=None) -> None:
        """Record ``step``: ``loss`` (a tensor or a number; None on a rank that has none, such as a pipeline's
        first stage) and the tensors of ``model`` (a module, several modules such as a stage's chunks, or a
        dict of name -> tensor). ``mean_over``: a process group (``dist.group.WORLD``) or a 1-D DeviceMesh
        (``mesh["dp"]``) whose ranks each hold their own batch's loss; the recorder records its mean, which every
        rank of it must then ask for."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"record(step={step!r}): a step is a whole number from 0, the same on every rank "
                              "and in the reference.")
        if step in self.run.losses or step in self.run.tensors:
            raise ConfigError(f"step {step} was recorded twice on rank {self.run.rank}: call record once per step, "
                              "after backward and before the optimizer's step.")
        seen = Seen(model, loss, self.precision)
        if seen.graph:
            self.run.graphs[step] = seen.graph
        if seen.everywhere:  # autocast, the loss's graph, precision=, TF32: what the whole step computed in
            self.run.computed[step] = self._precision(*seen.of("torch.float32"))
        if loss is not None:
            if mean_over is not None:
                self.run.own_losses[step] = loss_value(loss, None)
            self.run.losses[step] = loss_value(loss, mean_over)
            recorded = str(loss.dtype) if isinstance(loss, torch.Tensor) else "torch.float32"
            self.run.loss_dtypes[step] = self._precision(*seen.of(recorded))
            if mean_over is not None:
                self.run.dp_size = group_size(mean_over)
        if model is not None:
            pieces = {}
            for name, param, tensor in _named(model, self.run.kind):
                name = self._renamed(name)
                if name in pieces:
                    raise ConfigError(f"two tensors are called {name!r} on rank {self.run.rank} (after rename "
                                      "and the wrappers' names left out): give each its own name.")
                piece = self._piece(name, tensor)
                if piece.value is not None:
                    piece = replace(piece, dtype=self._precision(*seen.of(str(piece.value.dtype), param)))
                pieces[name] = piece
                if isinstance(param, torch.Tensor) and not param.requires_grad:
                    self.run.frozen.setdefault(step, []).append(name)
            self.run.tensors[step] = pieces
            if self.run.kind == "params" and self.run.world_size == 1 and not isinstance(model, Mapping):
                self.run.step_grads[step] = {self._renamed(name): Piece(None if g is None else g.detach().cpu().clone())
                                             for name, _, g in _named(model, "grads")}
            if self.run.start_step is None:
                self._keep_start(step, model)

    def _keep_start(self, step: int, model) -> None:
        """The parameters at the first step recorded with a model: those of a dict of tensors are not known."""
        self.run.start_step = step
        if self.run.kind == "params":
            return  # they are the record itself
        if isinstance(model, Mapping):
            return
        self.run.start = {self._renamed(name): self._piece(self._renamed(name), tensor)
                          for name, _, tensor in _named(model, "params")}

    def _precision(self, dtype: str, why: str) -> str:
        self.run.precision.setdefault(dtype, why)
        return dtype

    def _renamed(self, name: str) -> str:
        name = clean_name(name)
        if callable(self.rename):
            return self.rename(name)
        return dict(self.rename or {}).get(name, name)

    def _piece(self, name: str, tensor) -> Piece:
        if tensor is None:
            return Piece(None)
        if _is_dtensor(tensor):
            return _dtensor_piece(tensor)
        value = tensor.detach().cpu().clone()
        spec = self.shards.get(name)
        if isinstance(spec, tuple) and len(spec) == 2:  # (dim, slice): a box starting there along dim
            dim, where = spec
            dim = dim % value.dim() if -value.dim() <= dim < value.dim() else dim
            if not 0 <= dim < value.dim() or value.shape[dim] != where.stop - where.start:
                raise ConfigError(f"shards[{name!r}] = ({spec[0]}, slice({where.start}, {where.stop})) on rank "
                                  f"{self.run.rank}: its piece has shape {list(value.shape)}, which does not hold "
                                  f"{where.stop - where.start} entries along dim {spec[0]}: give the rows (or columns) "
                                  "this rank's tensor holds.")
            return Piece(value, offset=tuple(where.start if d == dim else 0 for d in range(value.dim())))
        return Piece(value, chunk=spec)


def _shard_spec(name, spec):
    """(dim, index, count): torch.chunk's piece; (dim, slice(start, stop)): entries start..stop-1 along dim."""
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[0], int) and isinstance(spec[1], slice):
        where = spec[1]
        if (isinstance(where.start, int) and isinstance(where.stop, int) and where.step in (None, 1)
                and 0 <= where.start < where.stop):
            return int(spec[0]), where
    ok = isinstance(spec, (tuple, list)) and len(spec) == 3 and all(isinstance(v, int) for v in spec)
    if not ok or not (spec[1] >= 0 and spec[2] >= 1 and spec[1] < spec[2]):
        raise ConfigError(f"shards[{name!r}] = {spec!r}: give (dim, index, count), this rank holding torch.chunk's "
                          "piece index of count along dim, e.g. (0, tp_rank, tp_size) for a column-parallel weight; "
                          "or (dim, slice(start, stop)) for a piece cut otherwise (tensor_split, uneven sizes).")
    return int(spec[0]), int(spec[1]), int(spec[2])


def _named(model, kind: str) -> Iterable[tuple[str, nn.Parameter | None, torch.Tensor | None]]:
    """(name, the parameter or None, what to record) of each tensor."""
    if isinstance(model, nn.Module):
        model = [model]
    if isinstance(model, Mapping):
        return [(str(n), None, t) for n, t in model.items()]
    if isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model):
        return [(n, p, p.grad if kind == "grads" else p) for m in model for n, p in m.named_parameters()]
    raise ConfigError(f"record(model=...) got {type(model).__name__}: give the module (or a list of a stage's "
                      "modules), or a dict of name -> tensor.")


def _is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def _dtensor_piece(tensor) -> Piece:
    """This rank's box of a DTensor, where torch's checkpointing (DCP) says it lies; Partial parts summed first
    (a collective over those mesh dims). A strided shard (FSDP2 over TP) is a box too wherever the boxes of all
    ranks tile the tensor; where they do not, the tensor is gathered whole."""
    from torch.distributed.tensor import Partial, Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = list(tensor.placements)
    if any(isinstance(p, Partial) for p in placements):
        placements = [Replicate() if isinstance(p, Partial) else p for p in placements]
        tensor = tensor.redistribute(tensor.device_mesh, placements)
    full, mesh = tuple(tensor.shape), tensor.device_mesh
    if not _boxes_tile(full, tuple(mesh.shape), tuple(placements)):  # the same answer on every rank of the mesh
        return Piece(tensor.full_tensor().detach().cpu().clone(), gathered=True)
    size, offset = compute_local_shape_and_global_offset(full, mesh, placements)
    local = tensor.to_local()
    if tuple(size) != tuple(local.shape):
        raise ConfigError(f"a DTensor of shape {list(full)} with placements {placements} holds a local tensor of "
                          f"shape {list(local.shape)} on rank {dist.get_rank()}, where torch expects "
                          f"{list(size)}: record it as its placements say, or gather it (full_tensor()) first.")
    return Piece(local.detach().cpu().clone(), offset=tuple(offset), full_shape=full)


@functools.lru_cache(maxsize=256)
def _boxes_tile(full: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple) -> bool:
    """Whether every mesh coordinate's piece is the box torch's offset and size say: the distinct boxes must not
    overlap and must cover the tensor. Torch gives a strided shard's first offset only; where the rows a rank
    holds are not consecutive (rows 0 and 2, say), its box overlaps another's."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    boxes = set()
    for coordinate in itertools.product(*(range(n) for n in mesh_shape)):
        size, offset = _compute_local_shape_and_global_offset(full, mesh_shape, list(coordinate), placements)
        if math.prod(size):
            boxes.add((tuple(offset), tuple(size)))
    if sum(math.prod(size) for _, size in boxes) != math.prod(full):
        return False
    return not any(all(oa < ob + sb and ob < oa + sa for oa, sa, ob, sb in zip(*a, *b))
                   for a, b in itertools.combinations(boxes, 2))
