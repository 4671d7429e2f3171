"""What a difference looks like, in words: what happened, why it is likely, what to check.

Each test below matches one shape a distributed bug leaves in the numbers, tried in this order: nothing at
all (a gradient that never arrived, or none on the whole rank), not a number, zero, a parameter equal to the
reference's value at another step (an update skipped, or recorded after it), a parameter whose last update is c x
the reference's (the learning rate), the sum or the mean over ranks
that hold the same piece (an all_reduce missing), a whole multiple or fraction of the reference (a sum where a
mean belongs, gradient accumulation, a division too many), the piece of another rank (shards swapped), a piece
summed or averaged with other ranks' pieces (an all_reduce over the wrong group), ranks that should agree but
do not (they drifted apart). A difference none of them explains is named with what to compare next.

Where two causes leave the same numbers, the words name both; an inference says what would confirm it. The
loss is evidence about the forward only where it matches to float32's rounding: a loss within a bfloat16
tolerance can still be 2 % wrong. A shape fits where what is left of the difference is within the case's own
tolerance (the test that found it), so a rank said to equal the reference passed that test; under bfloat16 that
tolerance can hide a fit, and where none fits the words say that the record cannot tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ppkit.parity.tolerance import Tolerance, default_tolerance

UNIT = 1e-3  # a factor this close to 1 is no factor: a drift past the tolerance, not a scale


@dataclass(frozen=True)
class Case:
    """The first difference and what it is compared with. ``peers``: every rank holding the same piece ->
    its value (this rank included); ``elsewhere``: the reference's pieces other ranks hold, by rank;
    ``forward``: "equal" where every rank's loss at this step equals the reference's to float32's rounding,
    "loose" where it is only within the tolerance, "" where no loss was compared or it differs; ``other_steps``:
    the reference's value of this piece at the other steps (parameters only); ``no_grads``: every tensor this rank
    recorded at this step is None; ``dp_size``: the size of the group the loss was averaged over (None: not said)."""

    kind: str                                  # "loss", "grad" or "param"
    name: str                                  # "loss" for a loss
    step: int
    rank: int
    got: torch.Tensor | None
    want: torch.Tensor | None
    peers: dict[int, torch.Tensor | None]
    elsewhere: dict[int, torch.Tensor]
    held: dict[int, tuple[torch.Tensor | None, torch.Tensor | None]]  # every rank holding it: (got, want)
    tolerance: Tolerance
    forward: str = ""
    loss_rel: float | None = None
    other_steps: dict[int, torch.Tensor | None] = field(default_factory=dict)
    no_grads: bool = False
    has_loss: bool = False                     # this rank recorded a loss at this step
    dp_size: int | None = None
    world_size: int = 1
    scale: float = 0.0                         # the reference tensor's largest |value|
    loss_dtype: str = ""                       # the precision the loss at this step was judged in
    graph: str = ""                            # the dtype this rank's loss graph showed at this step ("": none)
    matched_before: bool = False               # this rank recorded it at the step before, where nothing differed


@dataclass(frozen=True)
class Diagnosis:
    what: str
    why: str
    check: str
    shaped: bool = True                        # False: no shape fits (the words say what to compare next)


def _fits(case: Case, got: torch.Tensor, want: torch.Tensor) -> bool:
    """got equals want but for the rounding the case's tolerance allows (the test that found the difference: a
    shape fits exactly where a rank's piece would have passed)."""
    if got.shape != want.shape:
        return False
    if not got.numel():
        return True
    scale = max(case.scale, float(want.abs().max()))
    return case.tolerance.allows(float((got - want).abs().max()), scale, case.step)


def _scale(case: Case, got: torch.Tensor, want: torch.Tensor) -> float | None:
    """c with got = c * want, when such a c explains the difference; None for c so near 1 (within UNIT, or twice
    the tolerance: bf16's lets 1.1x fit what is no scale) that the fit says nothing."""
    norm = float((want * want).sum())
    if norm == 0.0:
        return None
    c = float((got * want).sum()) / norm
    near = max(UNIT, 2 * case.tolerance.at(case.step)[0])  # nearer 1, the tolerance alone could make the fit
    return c if (abs(c - 1) > near or _whole(case, c) or _whole(case, 1 / c)) and _fits(case, got, c * want) \
        else None


def _whole(case: Case, c: float) -> int | None:
    """k where c is k to 2 % (the least-squares c averages the rounding out: bf16's 2x comes out within 1 %)."""
    k = round(c)
    return k if k >= 2 and abs(c - k) < 2e-2 * k else None


def diagnose(case: Case) -> Diagnosis:
    """The most likely cause of ``case``'s difference."""
    thing = _noun(case)
    if case.got is None and case.no_grads and not case.has_loss:
        return Diagnosis(f"every gradient rank {case.rank} recorded at step {case.step} is None ({case.name} among "
                         "them), and it recorded no loss",
                         "no backward reached this rank's parameters before record: in a pipeline, a stage's output "
                         "was detached or dropped before the next stage, or the gradient sent back was never used "
                         "(torch.autograd.backward(output, received_gradient) missing); or record was called after "
                         "optimizer.zero_grad(), which sets every .grad to None by default",
                         "that this stage calls torch.autograd.backward(output, received_gradient) on an output that "
                         "kept its graph, and that record comes before optimizer.step() and zero_grad()")
    if case.got is None and case.no_grads:
        return Diagnosis(f"every gradient rank {case.rank} recorded at step {case.step} is None ({case.name} "
                         "among them)",
                         "no backward had filled .grad when record ran: most likely record was called after "
                         "optimizer.zero_grad() (or model.zero_grad()), which sets every .grad to None by default, "
                         "or before loss.backward(); or the model recorded is not the one that was trained",
                         "the order in the loop: loss.backward(), then record(step, model, loss), then "
                         "optimizer.step() and optimizer.zero_grad()")
    if case.got is None:
        return Diagnosis(f"rank {case.rank} has no gradient for {case.name} (its .grad is None)",
                         "backward never reached this parameter on that rank, while it reached others: the "
                         "parameter was not used in this rank's forward, or, in a pipeline, a stage's output was "
                         "detached or dropped before the next stage, or the gradient sent back was never used",
                         "that this rank's forward uses the parameter; in a pipeline, that the stage's output keeps "
                         "its graph (no .detach() before the send), that the next stage sends the gradient of its "
                         "input back, and that this stage calls torch.autograd.backward(output, received_gradient)")
    if case.want is None:
        return Diagnosis(f"rank {case.rank} has a gradient of {case.name}, which the reference has not",
                         "the parameter takes part in the parallel run's graph but not in the reference's: frozen "
                         "(requires_grad=False) or unused there",
                         "that both models use the same layers and freeze the same parameters")
    got, want = case.got.double(), case.want.double()
    if not torch.isfinite(got).all():
        return Diagnosis(f"the {thing} holds NaN or inf on rank {case.rank}",
                         "an overflow (a low-precision dtype, a loss scale) or a division by zero",
                         "the first step where it appears, and the dtype of every tensor that reaches it")
    if not got.any() and want.any():
        return Diagnosis(f"the {thing} is all zeros on rank {case.rank}",
                         "nothing reached it: a stage's output dropped or detached, a gradient received into a "
                         "buffer that was never filled, or zero_grad called between backward and this record",
                         "the stage boundary (send, recv, backward with the received gradient) and where "
                         "zero_grad and record are called")
    peers = {r: v.double() for r, v in case.peers.items() if v is not None}
    found = (_skipped(case, got, thing) or _updated(case, got, want, thing)
             or _partial(case, got, want, peers) or _scaled(case, got, want, thing)
             or _swapped(case, got, thing) or _mixed(case, got, want, thing))
    if found:
        return found
    if len(peers) > 1 and not all(_fits(case, v, got) for v in peers.values()):
        ranks = sorted(peers)
        if case.forward == "equal" and case.kind == "grad":
            return Diagnosis(f"ranks {ranks} hold different gradients of {case.name}, which they share, while the "
                             f"loss at step {case.step} equals the reference's",
                             "the loss matching to float32's rounding points at the backward (an inference: the "
                             "layers' outputs, recorded on both sides as a dict of name -> tensor, would confirm "
                             "it): most likely an all_reduce is missing in backward, so each rank kept only its own "
                             "part of a gradient. In a tensor-parallel block that is "
                             "the gradient of the block's input (Megatron's f: identity forward, all_reduce backward)",
                             f"the layers between {case.name} and the next parallel block: the block's input must go "
                             "through an all_reduce-in-backward function (ppkit.lessons.tensor_parallel."
                             "copy_to_parallel), and nothing else may sum it")
        return Diagnosis(f"ranks {ranks} hold different values for the same {thing}",
                         "ranks that should agree drifted apart: one skipped an all_reduce or an optimizer step, "
                         "or saw other data, or they did not start from the same weights (no broadcast, or another "
                         "seed)",
                         "that every rank builds the model from the same seed and calls the same collectives and "
                         "optimizer steps; record what='params' from step 0 to see which step they part")
    scale = max(case.scale, float(want.abs().max()), 1e-30)
    rel = float((got - want).abs().max()) / scale
    of = "of the reference's loss" if case.kind == "loss" else "of the tensor's largest value"
    if case.kind == "param":
        return _param_differs(case, rel, thing)
    where = ("the forward matches (the loss equals the reference's to float32's rounding at this step), so the "
             "backward differs" if case.forward == "equal" else "the numbers differ in no simple pattern")
    return Diagnosis(f"the {thing} differs on rank {case.rank} by {rel:.2g} {of}{_loose(case)}",
                     f"{where}: {_no_shape(case)}; the data a rank or micro-batch saw, their order, the start "
                     f"weights (a seed, no broadcast), or the layer's math differs{_stepped(case)}"
                     f"{_unseen_precision(case, rel)}",
                     "the inputs and targets each rank and each micro-batch gets (and their order between pipeline "
                     "stages), then record what='params' or a layer's output to find the first that differs",
                     shaped=False)


def _param_differs(case: Case, rel: float, thing: str) -> Diagnosis:
    """A parameter in no shape: its update differs, which its gradient, the start weights or the optimizer can
    make, and so can Adam's division by sqrt(v) of float32's rounding: name all of them."""
    return Diagnosis(f"the {thing} differs on rank {case.rank} by {rel:.2g} of the tensor's largest value"
                     f"{_loose(case)}",
                     f"the numbers differ in no simple pattern: {_no_shape(case)}; an update differs: its gradient "
                     "(the data a rank saw, their order, the layer's math), the start weights (a seed, no "
                     "broadcast), or the optimizer (its learning rate, its settings, a step skipped on this rank); "
                     "or no bug at all: Adam and AdamW divide by sqrt(v), so a gradient element near zero turns "
                     f"float32's rounding into an update as large as the learning rate{_unseen_precision(case, rel)}",
                     "record what='grads' for the same steps: gradients equal to the reference's rule out the data "
                     "and the backward and leave the optimizer (its settings, or Adam's amplified rounding where "
                     "the differences stay below the learning rate)",
                     shaped=False)


def _stepped(case: Case) -> str:
    """After a step where everything matched, the optimizer step between is as likely a cause as the data."""
    if not case.matched_before:
        return ""
    return (f"; or the optimizer step between: everything this rank recorded at step {case.step - 1} matched the "
            "reference, so its parameters may have been updated otherwise since (a learning rate or optimizer "
            "setting of its own, an optimizer.step() skipped on a rank; record what='params' to see it)")


def _no_shape(case: Case) -> str:
    """What the shapes' tests ruled out, and, under a loose tolerance, that they could not rule it out."""
    rtol = case.tolerance.at(case.step)[0]
    of = "of the reference's loss" if case.kind == "loss" else "of the tensor's largest value"
    if not _loose_tolerance(case):
        return (f"no scale (beyond {UNIT:.1%}), partial sum nor swapped piece fits it to within the tolerance "
                f"({rtol:.2g} {of})")
    dtype = case.tolerance.dtype.removeprefix("torch.")
    return (f"no scale, partial sum nor swapped piece fits it to within {dtype}'s tolerance ({rtol:.2g} {of}), "
            f"but {dtype}'s rounding is large enough to hide such a fit, so the record cannot tell whether one of "
            "them is the cause")


def _loose(case: Case) -> str:
    """A loss that passed only within a loose tolerance is no evidence about the forward: say so."""
    if case.forward != "loose" or case.loss_rel is None:
        return ""
    dtype = (case.loss_dtype or "torch.float32").removeprefix("torch.")
    return (f"; the loss at step {case.step} passed, but only within the {dtype} tolerance: the largest rank's "
            f"loss differs by {case.loss_rel:.2g} of the reference's, so it does not show that the forward is right")


def _unseen_precision(case: Case, rel: float) -> str:
    """A float32-judged difference small enough to be a lower precision's rounding, on a rank whose loss graph
    the recorder did not see (a float32 graph rules it out): name that explanation too."""
    if case.tolerance.dtype != "torch.float32" or not case.tolerance.grows or case.graph:
        return ""
    if rel > default_tolerance("torch.bfloat16").at(case.step)[0]:
        return ""
    return ("; or, if the run computed in bfloat16 where the recorder could not see it (an autocast region that "
            "ended before record, on ranks whose loss is a number, detached or absent, as a pipeline stage's "
            "without the loss is), a difference this size is that rounding: ParityRecorder(precision=torch.bfloat16) "
            "on the ranks then compares within it")


def _updated(case: Case, got, want, thing: str) -> Diagnosis | None:
    """A parameter that equalled the reference's at the step before and whose change since is c x the
    reference's change: the step that made it was c x larger (the learning rate, or the gradient it used)."""
    if case.kind != "param" or not case.matched_before or case.other_steps.get(case.step - 1) is None:
        return None
    before = case.other_steps[case.step - 1].double()
    mine, theirs = got - before, want - before
    norm = float((theirs * theirs).sum())
    if before.shape != got.shape or norm == 0.0:
        return None
    c = float((mine * theirs).sum()) / norm
    if abs(c - 1) <= UNIT or not case.tolerance.allows(float((mine - c * theirs).abs().max()), case.scale,
                                                         case.step):
        return None
    factor = f"{round(c)}x" if abs(c - round(c)) < UNIT else _factor(c)
    return Diagnosis(f"rank {case.rank}'s {thing} equalled the reference's at step {case.step - 1}, and its change "
                     f"since (its value minus the reference's at step {case.step - 1}) is {factor} the reference's "
                     "update",
                     f"the optimizer step between them was {factor} larger on rank {case.rank}: most likely its "
                     f"learning rate is {factor} the reference's (an optimizer or scheduler built otherwise on this "
                     "rank), or, with SGD, the gradient it stepped with was scaled after it was recorded",
                     f"the optimizer rank {case.rank} builds (lr, scheduler, weight decay) against the reference's; "
                     f"record what='grads' at step {case.step - 1}: gradients that equal the reference's point at "
                     "the optimizer")


def _skipped(case: Case, got, thing: str) -> Diagnosis | None:
    """A parameter equal to the reference's value at another step: the nearest earlier one (that rank missed the
    updates since), else a later one (it took updates the reference had not yet, or records after the step)."""
    if case.kind != "param":
        return None
    order = sorted((t for t in case.other_steps if t < case.step), reverse=True) + \
        sorted(t for t in case.other_steps if t > case.step)
    for step in order:
        other = case.other_steps[step]
        if other is None or other.shape != got.shape:
            continue
        if not case.tolerance.allows(float((got - other.double()).abs().max()), case.scale, case.step):
            continue
        what = f"rank {case.rank}'s {thing} at step {case.step} equals the reference's value at step {step}"
        if step > case.step:
            return Diagnosis(what, "this rank records the parameters at another point of the loop than the "
                                   "reference (after optimizer.step() here, before it there), or it stepped "
                                   f"{step - case.step} more time(s) than the reference",
                             "where record is called on both sides: after backward and before optimizer.step()")
        missed = case.step - step
        return Diagnosis(what,
                         f"the parameter missed {missed} update{'s' if missed > 1 else ''}: most likely rank "
                         f"{case.rank} skipped optimizer.step() (a branch on the rank, an early continue, a "
                         "GradScaler that found inf and skipped it), or its optimizer does not hold this "
                         "parameter; or this rank records the parameters at another point of the loop than the "
                         "reference (before optimizer.step() here, after it there)",
                         "that every rank calls optimizer.step() at every step, and that the optimizer was "
                         "built over this model's parameters (after wrapping it)")
    return None


def _partial(case: Case, got, want, peers) -> Diagnosis | None:
    if len(peers) < 2 or any(v.shape != want.shape for v in peers.values()):
        return None
    if all(_fits(case, v, got) for v in peers.values()):
        return None  # the ranks agree: a sum of equal parts is a scale (1/world_size each), not parts
    ranks = sorted(peers)
    total = sum(peers.values())
    if _fits(case, total, want):
        if case.kind == "loss":
            return Diagnosis(f"the ranks' losses add up to the reference's (ranks {ranks})",
                             "each rank's loss was divided by the number of ranks, and then not all_reduced",
                             "record the loss before dividing it, with mean_over=the data-parallel group")
        missing = ("the forward is right (the loss equals the reference's), so an all_reduce is missing in "
                   "backward: in a tensor-parallel block, the backward of its input (Megatron's f, identity forward "
                   "and all_reduce backward)") if case.forward == "equal" else (
                   "an all_reduce is missing: in a tensor-parallel block, the backward of its input (Megatron's f, "
                   "identity forward and all_reduce backward) or the forward of its output (g)")
        return Diagnosis(f"each of ranks {ranks} holds only its own part of the {_noun(case)}: their sum is "
                         "the reference",
                         f"{missing}; in data parallel, the ranks' gradients were never summed",
                         "the block's entry: the input must go through an all_reduce-in-backward function "
                         "(copy_to_parallel) so that every rank gets the full gradient of what it shares")
    if _fits(case, total / len(peers), want):
        if case.kind == "loss":
            return Diagnosis(f"the mean of the ranks' losses is the reference's (ranks {ranks})",
                             "each rank recorded its own batch's loss",
                             "record(step, model, loss, mean_over=the data-parallel group), or all_reduce the loss "
                             "and divide by the group's size")
        return Diagnosis(f"the mean over ranks {ranks} of the {_noun(case)} is the reference",
                         "each rank kept its own batch's gradient: the data-parallel all_reduce (and its average) "
                         f"is missing{_grouped(case, peers)}",
                         "that DDP or FSDP wraps the model, or that every gradient is all_reduced over the "
                         "data-parallel group (group=mesh['dp'].get_group()) and divided by its size before the "
                         "optimizer's step")
    return None


def _grouped(case: Case, peers: dict) -> str:
    """Ranks that agree in groups (0 and 1, 2 and 3) while the groups differ: an all_reduce over each group, where
    one across them belongs, leaves the same numbers as none at all, for a tensor the ranks of a group hold alike."""
    groups: list[list[int]] = []
    for rank in sorted(peers):
        same = next((g for g in groups if _fits(case, peers[rank], peers[g[0]])), None)
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


def _scaled(case: Case, got, want, thing: str) -> Diagnosis | None:
    c = _scale(case, got, want)
    if c is None:
        return None
    held = case.held
    alike = all(g is not None and w is not None and _fits(case, g.double(), c * w.double()) for g, w in held.values())
    on = "every rank" if len(held) > 1 and alike else f"rank {case.rank}"
    k, inverse = _whole(case, c), _whole(case, 1 / c) if c else None
    if want.numel() == 1 and not (k or inverse):
        return None  # any number is some multiple of another: a scale says nothing about one value
    others = [r for r, (g, w) in held.items() if r != case.rank]
    if others and all(g is not None and w is not None and _fits(case, g.double(), w.double())
                      for r, (g, w) in held.items() if r != case.rank) and (k or inverse or not _loose_tolerance(case)):
        factor = f"{k}x" if k else f"1/{inverse}" if inverse else _factor(c)
        return Diagnosis(f"the {thing} is {factor} the reference on rank {case.rank} only",
                         f"{_ranks_pieces(others)} the reference, so no collective is at "
                         "fault (a sum or an average over ranks would touch every rank's piece): something rank "
                         f"{case.rank} alone did to it",
                         f"code that runs on rank {case.rank} only (a branch on the rank or on a mesh coordinate), "
                         "and a backward or gradient accumulation that ran more (or fewer) times there")
    if k:
        return Diagnosis(f"the {thing} is {k}x the reference on {on}", _whole_causes(case, k),
                         "the gradient all_reduce (divide by the number of data-parallel ranks or use ReduceOp.AVG; "
                         "DDP and FSDP already average: do not sum again), and, with gradient accumulation, that "
                         "each micro-batch's loss is divided by the number of micro-batches")
    if inverse:
        return Diagnosis(f"the {thing} is 1/{inverse} of the reference on {on}",
                         f"divided by {inverse} where a sum belongs: an average over ranks that each hold a part (a "
                         "tensor-parallel all_reduce must sum), or divided twice (DDP averages already)",
                         f"every division by the world size ({inverse}): keep the one of the data-parallel average, "
                         "drop the others")
    if _loose_tolerance(case):
        dtype = case.tolerance.dtype.removeprefix("torch.")
        return Diagnosis(f"the {thing} is close to {_factor(c)} the reference on {on}, to within {dtype}'s rounding",
                         f"a scale differs ({'the learning rate, ' if case.kind == 'param' else ''}the loss's "
                         "normalisation, gradient accumulation's division, a loss scale), or no scale at all: "
                         f"{dtype}'s rounding is large enough that a difference in the data a rank saw can fit a "
                         "scale this near 1, and the record cannot tell them apart",
                         "every factor applied to the loss and the gradients, against the reference's, then the "
                         "data each rank gets; compare in float32 to tell a scale from other data")
    return Diagnosis(f"the {thing} is {_factor(c)} the reference on {on}",
                     f"a scale differs: {'the learning rate, ' if case.kind == 'param' else ''}the loss's "
                     "normalisation (a sum over tokens where the reference takes the mean), gradient accumulation's "
                     "division, or a loss scale",
                     "every factor applied to the loss and the gradients, against the reference's")


def _factor(c: float) -> str:
    """c as a factor, with the digits that tell it from 1."""
    return f"{c:.4g}x" if abs(c - 1) < 1e-2 else f"{c:.3g}x"


def _loose_tolerance(case: Case) -> bool:
    return case.tolerance.dtype not in ("torch.float32", "torch.float64", "")


def _whole_causes(case: Case, k: int) -> str:
    """The causes a whole factor k on every rank fits, and which of them the mesh rules out."""
    dp, world = case.dp_size, case.world_size
    causes = [f"gradient accumulation over {k} micro-batches whose losses were not divided by {k} (each backward "
              "adds its whole gradient)",
              f"a loss {k}x the reference's before backward (summed where the reference takes a mean)"]
    ruled = ""
    if dp is None and (k > world or world % k):
        ruled = (f"; a data-parallel sum alone does not fit: {k} data-parallel ranks cannot be made of this run's "
                 f"{world}")
    elif dp is None:
        causes.append(f"if this run has {k} data-parallel ranks, an all_reduce that summed where it should average "
                      "(the record does not say how many ranks are data-parallel: record(step, model, loss, "
                      "mean_over=the data-parallel group) says it)")
    elif dp == k:
        causes.insert(0, f"a data-parallel all_reduce that summed where it should average (the loss was averaged over "
                         f"{dp} ranks, mean_over=, and a sum over {dp} data-parallel ranks is {dp}x)")
    else:
        ruled = (f"; a data-parallel sum alone does not fit: the loss was averaged over {dp} ranks (mean_over=), the "
                 f"data-parallel ones if that group is right, and a sum over them would be {dp}x")
    if dp and dp * k == world:
        causes.append(f"an all_reduce over all {world} ranks where the {dp} data-parallel ranks' group belongs, "
                      f"divided by {dp}: a tensor that the other ranks hold alike (replicated over tensor "
                      f"parallelism) is then counted {k} times")
    return f"{len(causes)} causes fit: " + "; ".join(causes) + ruled


def _ranks_pieces(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s piece equals"
    return f"ranks {', '.join(map(str, ranks))}' pieces equal"


def _swapped(case: Case, got, thing: str) -> Diagnosis | None:
    owners = [r for r, other in case.elsewhere.items() if _fits(case, got, other.double())]
    if not owners:
        return None
    return Diagnosis(f"rank {case.rank} holds the piece of the {thing} that belongs to rank {owners[0]}",
                     "the shards are swapped: the shard index or mesh coordinate used to cut the tensor is not the "
                     "rank's own",
                     "the index each rank cuts with (its rank in the tensor-parallel group, not the global rank) and "
                     "the shards= given to the recorder")


def _mixed(case: Case, got, want, thing: str) -> Diagnosis | None:
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
        if _fits(case, got, combined) and not _fits(case, got, want):
            mine = f"its own piece and {_owners(owners)} (the reference's)"
            verb = "averaged with" if label == "the mean" else "added to"
            return Diagnosis(f"rank {case.rank}'s piece of the {thing} is {label} of {mine}: it was {verb} other "
                             "ranks' pieces",
                             "an all_reduce over the wrong group: it spans ranks that hold different pieces of this "
                             "tensor, so pieces of different places were added: the default WORLD group where the "
                             "data-parallel group belongs, or an all_reduce of a shard that FSDP or DTensor already "
                             "reduced (a sharded gradient needs none of your own)",
                             "the group= of every gradient all_reduce: the data-parallel group (mesh['dp']."
                             "get_group()), not the default WORLD, and none on gradients FSDP2 already reduced")
    return None


def _owners(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s piece"
    return f"the pieces of ranks {', '.join(map(str, ranks))}"


def _noun(case: Case) -> str:
    return {"loss": "loss", "grad": f"gradient of {case.name}"}.get(case.kind, f"parameter {case.name}")
