"""Lesson 14: a checkpoint saved on one mesh and loaded on another, with torch.distributed.checkpoint (DCP).

    save      (on every rank of a mesh) the model's and Adam's state, each rank writing its own shards
    load      (on every rank of another mesh) the same state, each rank reading the pieces of the shards it now holds
    stored    what DCP wrote: its files (one per rank, and .metadata) and, per FQN, the chunks saved
    ranks_group  the process group DCP runs on when the mesh is the cluster's first ranks only

Why resharding works: ``get_state_dict`` names every tensor by its FQN in the whole model (``layers.2.attention.wq.
weight``; a pipeline stage keeps the whole model's names) and keeps each one a DTensor, whose placements say which
slice of the full tensor a rank holds. DCP's .metadata records, per FQN, the full size and each saved chunk's offset
and size; on load each rank asks for the slices its own placements need, and DCP reads the overlapping parts of the
saved chunks, whichever mesh wrote them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ppkit.errors import ConfigError


def save(path: str, model, opt, process_group=None) -> None:
    """Model and optimizer state of this rank's stage into ``path``: every rank of ``process_group`` (default: the
    world) calls it, and DCP's planning and closing barrier run over that group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=path, process_group=process_group)


def load(path: str, model, opt, process_group=None) -> None:
    """Restore this rank's stage and optimizer from ``path``, saved on any mesh: every rank of ``process_group``
    (default: the world) calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise ConfigError(f"no checkpoint at {path!r} (no .metadata file there): save one first with "
                          "capstone.run_mesh(..., save=path), then load it from the same folder.")
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": opt_state}
    # fills the DTensors in place, each rank its own slices
    dcp.load(state, checkpoint_id=path, process_group=process_group)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def ranks_group(ranks: int, world_size: int):
    """The process group of ranks 0 .. ``ranks`` - 1 (None: the whole world), made once per worker by every rank of
    the world: DCP's collectives (planning, the final barrier) run on it, and ranks outside the mesh never join."""
    import torch.distributed as dist

    if ranks == world_size:
        return None
    if ranks not in _GROUPS:
        _GROUPS[ranks] = dist.new_group(list(range(ranks)))
    return _GROUPS[ranks]


_GROUPS: dict = {}


@dataclass(frozen=True)
class Stored:
    files: dict[str, int]                  # file name -> bytes
    chunks: dict[str, list[tuple]]         # FQN -> [(offsets, sizes), ...] as saved
    sizes: dict[str, tuple[int, ...]]      # FQN -> the full tensor's size


def stored(path: str) -> Stored:
    """What DCP wrote at ``path``: its files, and per tensor (model and optimizer state) the chunks it holds."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise ConfigError(f"no checkpoint at {path!r} (no .metadata file there): save one first.")
    files = {name: os.path.getsize(os.path.join(path, name)) for name in sorted(os.listdir(path))}
    meta = FileSystemReader(path).read_metadata()
    chunks, sizes = {}, {}
    for fqn, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            sizes[fqn] = tuple(md.size)
            chunks[fqn] = [(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks]
    return Stored(files, chunks, sizes)
