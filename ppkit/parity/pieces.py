"""Where a rank's piece lies in the reference's tensor: the part it must equal (``wanted``), and whether the
pieces of all ranks cover the tensor (``check_covered``), refused with the reason the record shows when not."""

from __future__ import annotations

import torch

from ppkit.errors import ConfigError
from ppkit.parity.record import Piece


def wanted(full: torch.Tensor | None, piece: Piece, name: str, rank: int) -> torch.Tensor | None:
    """The reference's part that ``piece`` should equal."""
    if full is None or piece.value is None:
        return full if piece.value is None or full is None else None
    shape = tuple(piece.value.shape)
    if piece.full_shape is not None:
        if tuple(full.shape) != piece.full_shape:
            raise ConfigError(f"rank {rank}'s {name} is a piece of a {list(piece.full_shape)} tensor, the "
                              f"reference's is {list(full.shape)}: the two models differ in size.")
        return full[tuple(slice(o, o + s) for o, s in zip(piece.offset, shape))]
    if piece.offset is not None:  # a box the learner declared: (dim, slice(start, stop))
        box = tuple(slice(o, o + s) for o, s in zip(piece.offset, shape))
        inside = len(shape) == full.dim() and all(b.stop <= n for b, n in zip(box, full.shape))
        if not inside or tuple(full[box].shape) != shape:
            raise ConfigError(f"rank {rank} recorded {name} as the box at offset {list(piece.offset)} of shape "
                              f"{list(shape)}, which the reference's {list(full.shape)} does not hold there: check "
                              "the shards= (dim, slice(start, stop)) given to this rank's recorder.")
        return full[box]
    if piece.chunk is not None:
        dim, index, count = piece.chunk
        if not -full.dim() <= dim < full.dim():
            raise ConfigError(f"shards[{name!r}] names dim {dim}, but the reference's {name} has "
                              f"{full.dim()} dims.")
        chunks = torch.chunk(full, count, dim)
        part = chunks[index] if index < len(chunks) else full.narrow(dim, 0, 0)
        if tuple(part.shape) != shape:
            raise ConfigError(f"rank {rank} recorded {name} as piece {index} of {count} along dim {dim}, shape "
                              f"{list(shape)}; that piece of the reference's {list(full.shape)} has shape "
                              f"{list(part.shape)}: (dim, index, count) means torch.chunk's piece. A piece cut "
                              "otherwise (tensor_split, sizes of your own) is declared by where it lies: "
                              f"shards={{{name!r}: ({dim}, slice(start, stop))}}, its first and one past its last "
                              f"index along dim {dim}.")
        return part
    if tuple(full.shape) != shape:
        raise ConfigError(f"rank {rank}'s {name} has shape {list(shape)}, the reference's {list(full.shape)}. If this "
                          f"rank holds a piece of it, say which: ParityRecorder(shards={{{name!r}: (dim, index, "
                          "count)}}); a DTensor says it by itself.")
    return full


def check_covered(full: torch.Tensor | None, held: dict[int, Piece], name: str, step: int,
                   absent: list[int]) -> None:
    """Refuse pieces that leave part of the reference's tensor unchecked: a rank that returned nothing (``if rank
    == 0: return rec.run``) would otherwise hide a bug in its piece behind a report that says "equal"."""
    if full is None or any(p.value is None or p.gathered or (p.offset is None and p.chunk is None)
                           for p in held.values()):
        return  # some rank holds the whole tensor (or says it has no gradient, which is compared as such)
    covered = torch.zeros(full.shape, dtype=torch.bool)
    for piece in held.values():
        if piece.offset is not None:
            covered[tuple(slice(o, o + s) for o, s in zip(piece.offset, piece.value.shape))] = True
        else:
            dim, index, count = piece.chunk
            chunks = torch.chunk(covered, count, dim)  # views: filling one fills its part of covered
            if index < len(chunks):
                chunks[index].fill_(True)
    done = int(covered.sum())
    if done < full.numel():
        ranks = sorted(held)
        said = (f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} recorded pieces of {name} at step "
                f"{step} that cover {done} of its {full.numel()} elements: the rest was not compared.")
        if absent:
            raise ConfigError(f"{said} Rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} handed "
                              "back nothing: return recorder.run from every rank (not only from rank 0: each rank "
                              "records its own piece).")
        same = _same_pieces(held)
        if same:
            group, piece = same
            who = _and(group).capitalize()
            raise ConfigError(f"{said} {who} declared the same piece of {name} ({_where(piece)}), and no "
                              "rank declared the rest. Where these ranks hold different pieces, each must declare "
                              "its own: its index in the group that splits the tensor (its tensor-parallel rank, "
                              "say), not a fixed number.")
        raise ConfigError(f"{said} Check the offsets or shards= the pieces were recorded with: together they must "
                          "cover the tensor.")


def _same_pieces(held: dict[int, Piece]) -> tuple[list[int], Piece] | None:
    """The first set of ranks that hold the same place of a tensor."""
    groups: dict = {}
    for rank, piece in held.items():
        key = (piece.offset, piece.chunk, tuple(piece.value.shape))
        groups.setdefault(key, []).append(rank)
    for ranks in groups.values():
        if len(ranks) > 1:
            return ranks, held[ranks[0]]
    return None


def _where(piece: Piece) -> str:
    if piece.chunk is not None:
        dim, index, count = piece.chunk
        return f"torch.chunk's piece {index} of {count} along dim {dim}"
    return f"offset {list(piece.offset)}, shape {list(piece.value.shape)}"


def _and(ranks: list[int]) -> str:
    return "ranks " + (" and ".join(map(str, ranks)) if len(ranks) == 2 else
                       ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}")



def same_place(a: Piece, b: Piece) -> bool:
    shape_a = None if a.value is None else tuple(a.value.shape)
    shape_b = None if b.value is None else tuple(b.value.shape)
    return (a.offset, a.chunk, shape_a) == (b.offset, b.chunk, shape_b) or a.gathered or b.gathered
