"""The patterns collectives and sharding leave in a tensor, each fitted to the case: the sum or the mean over the
ranks that hold the same piece (an all_reduce missing, or over the wrong group), a whole multiple or fraction of the
reference (a sum where a mean belongs, gradient accumulation, a division too many), the piece of another rank
(shards swapped), a piece summed or averaged with other ranks' pieces (an all_reduce over the wrong group). Each
returns a Diagnosis, or None where its pattern does not fit."""

from __future__ import annotations

import torch

from ppkit.parity.case import Case, Diagnosis, noun
from ppkit.parity.fit import UNIT, as_factor, fits, loose_tolerance


def _scale(case: Case, got: torch.Tensor, want: torch.Tensor) -> float | None:
    """c with got = c * want, when such a c explains the difference; None for c so near 1 (within UNIT, or twice
    the tolerance: bf16's lets 1.1x fit what is no scale) that the fit says nothing."""
    norm = float((want * want).sum())
    if norm == 0.0:
        return None
    c = float((got * want).sum()) / norm
    near = max(UNIT, 2 * case.tolerance.at(case.step)[0])  # nearer 1, the tolerance alone could make the fit
    return c if (abs(c - 1) > near or _whole(case, c) or _whole(case, 1 / c)) and fits(case, got, c * want) \
        else None


def _whole(case: Case, c: float) -> int | None:
    """k where c is k to 2 % (the least-squares c averages the rounding out: bf16's 2x comes out within 1 %)."""
    k = round(c)
    return k if k >= 2 and abs(c - k) < 2e-2 * k else None


def partial(case: Case, got, want, peers) -> Diagnosis | None:
    if len(peers) < 2 or any(v.shape != want.shape for v in peers.values()):
        return None
    if all(fits(case, v, got) for v in peers.values()):
        return None  # the ranks agree: a sum of equal parts is a scale (1/world_size each), not parts
    ranks = sorted(peers)
    total = sum(peers.values())
    if fits(case, total, want):
        if case.kind == "loss":
            return Diagnosis(f"the ranks' losses add up to the reference's (ranks {ranks})",
                             "each rank's loss was divided by the number of ranks, and then not all_reduced",
                             "record the loss before dividing it, with mean_over=the data-parallel group",
                             causes=("loss_parts",))
        missing = ("the forward is right (the loss equals the reference's), so an all_reduce is missing in "
                   "backward: in a tensor-parallel block, the backward of its input (Megatron's f, identity forward "
                   "and all_reduce backward)") if case.forward == "equal" else (
                   "an all_reduce is missing: in a tensor-parallel block, the backward of its input (Megatron's f, "
                   "identity forward and all_reduce backward) or the forward of its output (g)")
        return Diagnosis(f"each of ranks {ranks} holds only its own part of the {noun(case)}: their sum is "
                         "the reference",
                         f"{missing}; in data parallel, the ranks' gradients were never summed",
                         "the block's entry: the input must go through an all_reduce-in-backward function "
                         "(copy_to_parallel) so that every rank gets the full gradient of what it shares",
                         causes=("partial",))
    if fits(case, total / len(peers), want):
        if case.kind == "loss":
            return Diagnosis(f"the mean of the ranks' losses is the reference's (ranks {ranks})",
                             "each rank recorded its own batch's loss",
                             "record(step, model, loss, mean_over=the data-parallel group), or all_reduce the loss "
                             "and divide by the group's size", causes=("loss_own",))
        grouped = _grouped(case, peers)
        return Diagnosis(f"the mean over ranks {ranks} of the {noun(case)} is the reference",
                         "each rank kept its own batch's gradient: the data-parallel all_reduce (and its average) "
                         f"is missing{grouped}",
                         "that DDP or FSDP wraps the model, or that every gradient is all_reduced over the "
                         "data-parallel group (group=mesh['dp'].get_group()) and divided by its size before the "
                         "optimizer's step", causes=("dp_missing", "wrong_group") if grouped else ("dp_missing",))
    return None


def _grouped(case: Case, peers: dict) -> str:
    """Ranks that agree in groups (0 and 1, 2 and 3) while the groups differ: an all_reduce over each group, where
    one across them belongs, leaves the same numbers as none at all, for a tensor the ranks of a group hold alike."""
    groups: list[list[int]] = []
    for rank in sorted(peers):
        same = next((g for g in groups if fits(case, peers[rank], peers[g[0]])), None)
        if same is None:
            groups.append([rank])
        else:
            same.append(rank)
    if len(groups) < 2 or all(len(g) == 1 for g in groups):
        return ""
    listed = " and ".join(f"ranks {', '.join(map(str, g))}" for g in groups)
    return (f", or it ran over the wrong group: {listed} each agree, so each group's ranks saw the same data (a "
            "tensor-parallel group) and an all_reduce over such a group (mesh['tp'] where mesh['dp'] belongs) "
            "changes nothing; the record cannot tell that from no all_reduce")


def scaled(case: Case, got, want, thing: str) -> Diagnosis | None:
    c = _scale(case, got, want)
    if c is None:
        return None
    held = case.held
    alike = all(g is not None and w is not None and fits(case, g.double(), c * w.double()) for g, w in held.values())
    on = "every rank" if len(held) > 1 and alike else f"rank {case.rank}"
    k, inverse = _whole(case, c), _whole(case, 1 / c) if c else None
    if want.numel() == 1 and not (k or inverse):
        return None  # any number is some multiple of another: a scale says nothing about one value
    others = [r for r, (g, w) in held.items() if r != case.rank]
    if others and all(g is not None and w is not None and fits(case, g.double(), w.double())
                      for r, (g, w) in held.items() if r != case.rank) and (k or inverse or not loose_tolerance(case)):
        factor = f"{k}x" if k else f"1/{inverse}" if inverse else as_factor(c)
        return Diagnosis(f"the {thing} is {factor} the reference on rank {case.rank} only",
                         f"{_ranks_pieces(others)} the reference, so no collective is at "
                         "fault (a sum or an average over ranks would touch every rank's piece): something rank "
                         f"{case.rank} alone did to it",
                         f"code that runs on rank {case.rank} only (a branch on the rank or on a mesh coordinate), "
                         "and a backward or gradient accumulation that ran more (or fewer) times there",
                         causes=("one_rank",))
    if k:
        words, ids = _whole_causes(case, k)
        return Diagnosis(f"the {thing} is {k}x the reference on {on}", words,
                         "the gradient all_reduce (divide by the number of data-parallel ranks or use ReduceOp.AVG; "
                         "DDP and FSDP already average: do not sum again), and, with gradient accumulation, that "
                         "each micro-batch's loss is divided by the number of micro-batches", causes=ids)
    if inverse:
        return Diagnosis(f"the {thing} is 1/{inverse} of the reference on {on}",
                         f"divided by {inverse} where a sum belongs: an average over ranks that each hold a part (a "
                         "tensor-parallel all_reduce must sum), or divided twice (DDP averages already)",
                         f"every division by the world size ({inverse}): keep the one of the data-parallel average, "
                         "drop the others", causes=("mean_not_sum", "divided_twice"))
    if loose_tolerance(case):
        dtype = case.tolerance.dtype.removeprefix("torch.")
        return Diagnosis(f"the {thing} is close to {as_factor(c)} the reference on {on}, to within {dtype}'s rounding",
                         f"a scale differs ({'the learning rate, ' if case.kind == 'param' else ''}the loss's "
                         "normalisation, gradient accumulation's division, a loss scale), or no scale at all: "
                         f"{dtype}'s rounding is large enough that a difference in the data a rank saw can fit a "
                         "scale this near 1, and the record cannot tell them apart",
                         "every factor applied to the loss and the gradients, against the reference's, then the "
                         "data each rank gets; compare in float32 to tell a scale from other data",
                         causes=(("lr",) if case.kind == "param" else ()) + ("scale_other", "data"))
    return Diagnosis(f"the {thing} is {as_factor(c)} the reference on {on}",
                     f"a scale differs: {'the learning rate, ' if case.kind == 'param' else ''}the loss's "
                     "normalisation (a sum over tokens where the reference takes the mean), gradient accumulation's "
                     "division, or a loss scale",
                     "every factor applied to the loss and the gradients, against the reference's",
                     causes=(("lr",) if case.kind == "param" else ()) + ("scale_other",))


def _whole_causes(case: Case, k: int) -> tuple[str, tuple[str, ...]]:
    """The causes a whole factor k on every rank fits, and which of them the mesh rules out: the words, and the
    causes' identifiers."""
    dp, world = case.dp_size, case.world_size
    causes = [f"gradient accumulation over {k} micro-batches whose losses were not divided by {k} (each backward "
              "adds its whole gradient)",
              f"a loss {k}x the reference's before backward (summed where the reference takes a mean)"]
    ids = ["accumulation", "loss_scale"]
    ruled = ""
    if dp is None and (k > world or world % k):
        ruled = (f"; a data-parallel sum alone does not fit: {k} data-parallel ranks cannot be made of this run's "
                 f"{world}")
    elif dp is None:
        causes.append(f"if this run has {k} data-parallel ranks, an all_reduce that summed where it should average "
                      "(the record does not say how many ranks are data-parallel: record(step, model, loss, "
                      "mean_over=the data-parallel group) says it)")
        ids.append("sum_not_mean")
    elif dp == k:
        causes.insert(0, f"a data-parallel all_reduce that summed where it should average (the loss was averaged over "
                         f"{dp} ranks, mean_over=, and a sum over {dp} data-parallel ranks is {dp}x)")
        ids.insert(0, "sum_not_mean")
    else:
        ruled = (f"; a data-parallel sum alone does not fit: the loss was averaged over {dp} ranks (mean_over=), the "
                 f"data-parallel ones if that group is right, and a sum over them would be {dp}x")
    if dp and dp * k == world:
        causes.append(f"an all_reduce over all {world} ranks where the {dp} data-parallel ranks' group belongs, "
                      f"divided by {dp}: a tensor that the other ranks hold alike (replicated over tensor "
                      f"parallelism) is then counted {k} times")
        ids.append("wrong_group")
    return f"{len(causes)} causes fit: " + "; ".join(causes) + ruled, tuple(ids)


def _ranks_pieces(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s piece equals"
    return f"ranks {', '.join(map(str, ranks))}' pieces equal"


def swapped(case: Case, got, thing: str) -> Diagnosis | None:
    owners = [r for r, other in case.elsewhere.items() if fits(case, got, other.double())]
    if not owners:
        return None
    return Diagnosis(f"rank {case.rank} holds the piece of the {thing} that belongs to rank {owners[0]}",
                     "the shards are swapped: the shard index or mesh coordinate used to cut the tensor is not the "
                     "rank's own",
                     "the index each rank cuts with (its rank in the tensor-parallel group, not the global rank) and "
                     "the shards= given to the recorder", causes=("swapped",))


def mixed(case: Case, got, want, thing: str) -> Diagnosis | None:
    """This rank's piece is the sum or the mean of its own piece and other ranks' different pieces (of the
    reference): an all_reduce whose group spans ranks that hold different pieces of the tensor."""
    pieces = [want]
    owners: list[int] = []
    for rank, other in sorted(case.elsewhere.items()):
        other = other.double()
        if other.shape == want.shape and not any(torch.equal(other, p) for p in pieces):
            pieces.append(other)
            owners.append(rank)
    if not owners:
        return None
    for label, combined in (("the mean", sum(pieces) / len(pieces)), ("the sum", sum(pieces))):
        if fits(case, got, combined) and not fits(case, got, want):
            mine = f"its own piece and {_owners(owners)} (the reference's)"
            verb = "averaged with" if label == "the mean" else "added to"
            return Diagnosis(f"rank {case.rank}'s piece of the {thing} is {label} of {mine}: it was {verb} other "
                             "ranks' pieces",
                             "an all_reduce over the wrong group: it spans ranks that hold different pieces of this "
                             "tensor, so pieces of different places were added: the default WORLD group where the "
                             "data-parallel group belongs, or an all_reduce of a shard that FSDP or DTensor already "
                             "reduced (a sharded gradient needs none of your own)",
                             "the group= of every gradient all_reduce: the data-parallel group (mesh['dp']."
                             "get_group()), not the default WORLD, and none on gradients FSDP2 already reduced",
                             causes=("wrong_group",))
    return None


def _owners(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s piece"
    return f"the pieces of ranks {', '.join(map(str, ranks))}"



def one_scale(cases: list[Case], recorded: set) -> Diagnosis | None:
    """Every tensor recorded at the step, on every rank, differs, and all fit one factor c (least squares over
    all of them), far enough from 1 that the tolerance alone could not make it: the step was scaled (the loss, or
    the gradients together). Other data moves each tensor its own way; one factor fitting them all is a scale."""
    if len(cases) < 3 or {(c.rank, c.name) for c in cases} != recorded or any(c.kind != "grad" for c in cases):
        return None  # gradients only: a parameter c x the reference's is no update c x
    pairs = [(c, c.got.double(), c.want.double()) for c in cases if c.got is not None and c.want is not None]
    if len(pairs) != len(cases) or any(g.shape != w.shape for _, g, w in pairs):
        return None
    norm = sum(float((w * w).sum()) for _, _, w in pairs)
    if norm == 0.0:
        return None
    c = sum(float((g * w).sum()) for _, g, w in pairs) / norm
    if any(abs(c - 1) <= max(UNIT, 2 * case.tolerance.at(case.step)[0]) for case, _, _ in pairs):
        return None
    if not all(fits(case, g, c * w) for case, g, w in pairs):
        return None
    head = cases[0]
    ranks = sorted({case.rank for case in cases})
    return Diagnosis(f"every one of the {len({case.name for case in cases})} gradients recorded at step {head.step} is "
                     f"{as_factor(c)} the reference on ranks {', '.join(map(str, ranks))}",
                     "a scale differs at this step: the loss's normalisation, gradient accumulation's division, "
                     "or a loss scale. Each tensor alone is "
                     f"within {head.tolerance.dtype.removeprefix('torch.')}'s rounding of other data too, but other "
                     "data moves each tensor its own way, and one factor fits them all",
                     "every factor applied to the loss and the gradients from this step on, against the reference's",
                     causes=("scale_other",))
