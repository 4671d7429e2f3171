"""Lesson 11, context parallelism: which rank holds which part of the sequence, and proof that the ring
gives the same attention as one process.

    layout(seq_len, world_size, sharding)  Layout: the chunks of the sequence each rank holds
    work_formula(layout, causal)           score entries each rank computes (counted, no run)
    compare(rank, world_size, ...)         ring attention vs torch's full attention, forward and backward
    torch_context_parallel(rank, world_size, causal, backward, kernel)  what torch's own does on CPU

Two shardings. **contiguous**: rank r holds chunk r of world_size equal chunks. Under a causal mask
rank r's queries see r + 1 chunks of keys, so the last rank works world_size times as hard as the
first. **zigzag** (load-balanced): 2 x world_size chunks, rank r holds chunk r and chunk
2 x world_size - 1 - r, one from the cheap start and one from the expensive end, so every rank does the
same work.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ppkit.errors import ConfigError
from ppkit.lessons.ring_attention import merge, pair_kind, ring_attention

SHARDINGS = ("contiguous", "zigzag")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
# The ring adds the same numbers as one softmax in another order: float32 rounding, measured at
# most ~1e-6 at these sizes (inputs ~ N(0, 1)); the tests and the notebook hold it to this.
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def whole_number(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}.")
    return value


def _multiples(value: int, step: int) -> str:
    below, above = value // step * step, (value // step + 1) * step
    return f"{below} or {above}" if below > 0 else f"{above}"


@dataclass(frozen=True)
class Layout:
    """How a sequence of ``seq_len`` positions is cut over ``world_size`` ranks."""

    seq_len: int
    world_size: int
    sharding: str

    def __post_init__(self):
        if self.sharding not in SHARDINGS:
            raise ConfigError(f"sharding {self.sharding!r} is not one of {', '.join(SHARDINGS)}; pick one of them.")
        whole_number("seq_len", self.seq_len)
        whole_number("world_size", self.world_size)
        if self.seq_len % self.num_chunks:
            n, chunks = self.world_size, self.num_chunks
            why = (f"2 x {n} = {chunks} equal chunks, which zig-zag sharding over {n} ranks needs"
                   if self.sharding == "zigzag" else f"{n} equal chunks, one per rank")
            other = "" if self.sharding == "contiguous" else f" (or contiguous sharding, which needs a multiple of {n})"
            raise ConfigError(f"sequence length {self.seq_len} cannot be cut into {why}; pick a multiple of {chunks} "
                              f"such as {_multiples(self.seq_len, chunks)}{other}.")

    @property
    def num_chunks(self) -> int:
        return self.world_size * (2 if self.sharding == "zigzag" else 1)

    @property
    def chunk_size(self) -> int:
        return self.seq_len // self.num_chunks

    def chunks(self, rank: int) -> tuple[int, ...]:
        """The chunk numbers rank ``rank`` holds, in sequence order."""
        if self.sharding == "zigzag":
            return (rank, 2 * self.world_size - 1 - rank)
        return (rank,)

    def positions(self, rank: int) -> torch.Tensor:
        """The sequence positions of rank ``rank``'s rows, in the order it holds them."""
        c = self.chunk_size
        return torch.cat([torch.arange(i * c, (i + 1) * c) for i in self.chunks(rank)])

    def shard(self, full: torch.Tensor, rank: int, dim: int = 2) -> torch.Tensor:
        return full.index_select(dim, self.positions(rank))

    def unshard(self, shards, dim: int = 2) -> torch.Tensor:
        """The full tensor from every rank's shard (``shards[r]`` from rank r), in sequence order."""
        order = torch.cat([self.positions(r) for r in range(self.world_size)])
        return torch.cat(list(shards), dim=dim).index_select(dim, torch.argsort(order))

    def check_shard(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rank: int, world_size: int) -> None:
        """Refuse shards that are not rank ``rank``'s rows, or a layout made for another world size."""
        if world_size != self.world_size:
            raise ConfigError(f"the layout is for {self.world_size} ranks but the ring has {world_size}; "
                              f"make it with layout(seq_len, {world_size}, {self.sharding!r}).")
        rows = len(self.chunks(rank)) * self.chunk_size
        if q.dim() != 4 or q.shape[2] != rows:
            raise ConfigError(f"rank {rank} was given q of shape {tuple(q.shape)}; it needs (batch, heads, "
                              f"{rows}, head_dim): its rows layout.positions({rank}) of the full sequence.")
        if k.shape != q.shape or v.shape != q.shape:
            raise ConfigError(f"rank {rank} was given q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)}; "
                              "ring attention here needs all three of the same shape (the same rows and heads).")


def layout(seq_len: int, world_size: int, sharding: str = "zigzag") -> Layout:
    """A ``Layout``; a ConfigError says which value is impossible and what would work."""
    return Layout(seq_len, world_size, sharding)


def work_formula(lay: Layout, causal: bool) -> list[int]:
    """Attention scores each rank computes in one forward (diagonal pairs are computed whole, then
    masked, as flash attention does): the same for every rank without a mask or with zig-zag."""
    per_pair = lay.chunk_size ** 2
    return [per_pair * sum(pair_kind(i, j, causal) != "skip" for i in lay.chunks(rank)
                           for src in range(lay.world_size) for j in lay.chunks(src))
            for rank in range(lay.world_size)]


def inputs(seq_len: int, heads: int = 2, head_dim: int = 16, batch: int = 1, dtype: str = "float32", seed: int = 0):
    """q, k, v and an upstream gradient of shape (batch, heads, seq_len, head_dim), the same on every rank."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    for name, value in (("seq_len", seq_len), ("heads", heads), ("head_dim", head_dim), ("batch", batch)):
        whole_number(name, value)
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, seq_len, head_dim, generator=g, dtype=DTYPES[dtype]) for _ in range(4)]


def _diff(a, b) -> float:
    return float((a.detach() - b.detach()).abs().max())


def compare(rank, world_size, seq_len: int = 64, sharding: str = "zigzag", causal: bool = True,
            heads: int = 2, head_dim: int = 16, dtype: str = "float32", merge_fn=merge) -> dict:
    """Ring attention on this rank's rows against ``F.scaled_dot_product_attention`` on the whole
    sequence in this process: the largest difference of the output and of the gradients of q, k, v
    (loss = Σ out x upstream) over this rank's rows. ``merge_fn``: the merge the ring uses."""
    lay = layout(seq_len, world_size, sharding)
    q, k, v, upstream = inputs(seq_len, heads, head_dim, dtype=dtype)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*full, is_causal=causal)
    (want * upstream).sum().backward()
    mine = [lay.shard(t, rank).requires_grad_() for t in (q, k, v)]
    out = ring_attention(*mine, lay, causal, merge_fn=merge_fn)
    (out * lay.shard(upstream, rank)).sum().backward()
    errors = {"forward": _diff(out, lay.shard(want, rank))}
    errors.update({f"d{name}": _diff(m.grad, lay.shard(f.grad, rank)) for name, m, f in zip("qkv", mine, full)})
    return errors


# -- torch's own: torch.distributed.tensor.experimental.context_parallel ----------------------------

def ring_group(k: int):
    """The process group of ranks 0..k-1 (None: the whole world), made once per process. Every rank
    of the world must call it, members or not."""
    if k == dist.get_world_size():
        return None
    key = (id(dist.group.WORLD), k)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(range(k)))
    return _GROUPS[key]


_GROUPS: dict = {}


def torch_context_parallel(rank, world_size, causal: bool = False, backward: bool = False,
                           kernel: str = "default", ranks: int | None = None, seq_len: int = 64) -> dict:
    """Run torch's ``context_parallel`` on a CPU mesh of ranks 0..ranks-1, as its docs show: q, k, v
    sharded in place, ``F.scaled_dot_product_attention`` inside the context (with SDPA's ``kernel``,
    "default" or "math"). Returns what happened rather than raising: ``ran`` and the error, or the
    largest difference from full attention (output, and gradients with ``backward``) and, for the
    math kernel, the collectives ``CommDebugMode`` counted (on the default kernel it would double the
    10-40 s that DTensor's first sharding propagation through that kernel's decomposition takes)."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if kernel not in ("default", "math"):
        raise ConfigError(f"kernel {kernel!r} is not one of default, math.")
    ranks = world_size if ranks is None else ranks
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= world_size:
        raise ConfigError(f"ranks={ranks!r}: the world has {world_size} ranks, so the mesh can use 1 to "
                          f"{world_size} of them.")
    group = ring_group(ranks)
    if rank >= ranks:
        return None
    mesh = DeviceMesh.from_group(group, "cpu") if group else init_device_mesh("cpu", (world_size,))
    full = [t.requires_grad_() for t in inputs(seq_len)[:3]]
    want = F.scaled_dot_product_attention(*full, is_causal=causal)
    want.sum().backward()
    buffers = [t.detach().clone() for t in full]
    counter = CommDebugMode() if kernel == "math" else None
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            local = [b.detach().clone().requires_grad_(backward) for b in buffers]
            chosen = sdpa_kernel(SDPBackend.MATH) if kernel == "math" else nullcontext()
            with counter or nullcontext(), chosen, torch.enable_grad():
                out = F.scaled_dot_product_attention(*local, is_causal=causal)
                if backward:
                    out.sum().backward()
        got = context_parallel_unshard(mesh, [out.detach()] + [t.grad for t in local if backward], [2] * 4)
    except Exception as err:  # noqa: BLE001 - what torch raises here is the finding
        return {"ran": False, "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    wants = [want] + [t.grad for t in full] if backward else [want]
    counts = {str(op).split(".")[-1]: n for op, n in counter.get_comm_counts().items()} if counter else None
    return {"ran": True, "collectives": counts, "forward": _diff(got[0], want),
            "backward": max((_diff(g, w) for g, w in zip(got[1:], wants[1:])), default=None)}


def plot_layouts(seq_len: int, world_size: int, causal: bool = True):
    """The attention matrix (query position down, key position across) for each sharding: each block
    coloured by the rank that computes it, white where the causal mask lets it be skipped; the black
    line is the mask's edge (above it, computed and thrown away). The counted work per rank is titled."""
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.4))
    colors = ["white"] + [f"C{r % 10}" for r in range(world_size)]
    for ax, sharding in zip(fig.subplots(1, len(SHARDINGS)), SHARDINGS):
        lay = layout(seq_len, world_size, sharding)
        fine = 2 * world_size  # cells of seq_len / (2 x world_size): both layouts' chunks are whole cells
        per_chunk = fine // lay.num_chunks
        owner = {c: r for r in range(world_size) for c in lay.chunks(r)}
        grid = [[0 if pair_kind(qi // per_chunk, kj // per_chunk, causal) == "skip" else 1 + owner[qi // per_chunk]
                 for kj in range(fine)] for qi in range(fine)]
        ax.imshow(grid, cmap=ListedColormap(colors), vmin=0, vmax=world_size, extent=(0, seq_len, seq_len, 0))
        if causal:
            ax.plot([0, seq_len], [0, seq_len], color="black", linewidth=1)
        work = ", ".join(f"{w / 1e6:.2g}M" for w in work_formula(lay, causal))
        ax.set_title(f"{sharding}: scores per rank {work}", fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.legend(handles=[_patch(f"C{r % 10}", f"rank {r}") for r in range(world_size)], loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    return fig


def _patch(color, label):
    from matplotlib.patches import Patch

    return Patch(color=color, label=label)
