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

This module holds the order and the words where no shape fits; the shapes live beside it: optimizer_steps.py
(what the optimizer did), patterns.py (what collectives and sharding leave), both built on fit.py's test;
rounding.py says what a precision explains and hides; case.py holds the Case it is given and the Diagnosis it gives.
"""

from __future__ import annotations

import torch

from ppkit.parity.case import Case, Diagnosis, noun
from ppkit.parity.fit import fits
from ppkit.parity.inputs import same_batch, start_weights, weights_right
from ppkit.parity.optimizer_steps import skipped, stepped, updated
from ppkit.parity.patterns import mixed, partial, scaled, swapped
from ppkit.parity.rounding import loose, no_shape, unseen_precision


def diagnose(case: Case) -> Diagnosis:
    """The most likely cause of ``case``'s difference."""
    thing = noun(case)
    if case.got is None and case.no_grads and not case.has_loss:
        return Diagnosis(f"every gradient rank {case.rank} recorded at step {case.step} is None ({case.name} among "
                         "them), and it recorded no loss",
                         "no backward reached this rank's parameters before record: in a pipeline, a stage's output "
                         "was detached or dropped before the next stage, or the gradient sent back was never used "
                         "(torch.autograd.backward(output, received_gradient) missing); or record was called after "
                         "optimizer.zero_grad(), which sets every .grad to None by default",
                         "that this stage calls torch.autograd.backward(output, received_gradient) on an output that "
                         "kept its graph, and that record comes before optimizer.step() and zero_grad()",
                         causes=("detached", "grads_none"))
    if case.got is None and case.no_grads:
        return Diagnosis(f"every gradient rank {case.rank} recorded at step {case.step} is None ({case.name} "
                         "among them)",
                         "no backward had filled .grad when record ran: most likely record was called after "
                         "optimizer.zero_grad() (or model.zero_grad()), which sets every .grad to None by default, "
                         "or before loss.backward(); or the model recorded is not the one that was trained",
                         "the order in the loop: loss.backward(), then record(step, model, loss), then "
                         "optimizer.step() and optimizer.zero_grad()", causes=("grads_none", "wrong_model"))
    if case.frozen and case.want is not None:
        return _frozen(case, thing)
    if case.got is None:
        return Diagnosis(f"rank {case.rank} has no gradient for {case.name} (its .grad is None)",
                         "backward never reached this parameter on that rank, while it reached others: the "
                         "parameter was not used in this rank's forward, or, in a pipeline, a stage's output was "
                         "detached or dropped before the next stage, or the gradient sent back was never used",
                         "that this rank's forward uses the parameter; in a pipeline, that the stage's output keeps "
                         "its graph (no .detach() before the send), that the next stage sends the gradient of its "
                         "input back, and that this stage calls torch.autograd.backward(output, received_gradient)",
                         causes=("unused_param", "detached"))
    if case.want is None:
        return Diagnosis(f"rank {case.rank} has a gradient of {case.name}, which the reference has not",
                         "the parameter takes part in the parallel run's graph but not in the reference's: frozen "
                         "(requires_grad=False) or unused there",
                         "that both models use the same layers and freeze the same parameters", causes=("frozen",))
    got, want = case.got.double(), case.want.double()
    if not torch.isfinite(got).all():
        return Diagnosis(f"the {thing} holds NaN or inf on rank {case.rank}",
                         "an overflow (a low-precision dtype, a loss scale) or a division by zero",
                         "the first step where it appears, and the dtype of every tensor that reaches it",
                         causes=("nonfinite",))
    earlier = skipped(case, got, thing)  # a zero-initialised bias that never moved equals its start: not "zeroed"
    if earlier:
        return earlier
    if not got.any() and want.any():
        return Diagnosis(f"the {thing} is all zeros on rank {case.rank}",
                         "nothing reached it: a stage's output dropped or detached, a gradient received into a "
                         "buffer that was never filled, or zero_grad called between backward and this record",
                         "the stage boundary (send, recv, backward with the received gradient) and where "
                         "zero_grad and record are called", causes=("zeroed", "detached"))
    peers = {r: v.double() for r, v in case.peers.items() if v is not None}
    found = (updated(case, got, want, thing)
             or partial(case, got, want, peers) or scaled(case, got, want, thing)
             or swapped(case, got, thing) or mixed(case, got, want, thing)
             or start_weights(case) or same_batch(case))
    if found:
        return found
    if len(peers) > 1 and not all(fits(case, v, got) for v in peers.values()):
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
                             "copy_to_parallel), and nothing else may sum it", causes=("backward_allreduce",))
        return Diagnosis(f"ranks {ranks} hold different values for the same {thing}",
                         "ranks that should agree drifted apart: one skipped an all_reduce or an optimizer step, "
                         "or saw other data, or they did not start from the same weights (no broadcast, or another "
                         "seed)",
                         "that every rank builds the model from the same seed and calls the same collectives and "
                         "optimizer steps; record what='params' from step 0 to see which step they part",
                         causes=("drift",))
    scale = max(case.scale, float(want.abs().max()), 1e-30)
    rel = float((got - want).abs().max()) / scale
    of = "of the reference's loss" if case.kind == "loss" else "of the tensor's largest value"
    if case.kind == "param":
        return _param_differs(case, rel, thing)
    where = ("the forward matches (the loss equals the reference's to float32's rounding at this step), so the "
             "backward differs" if case.forward == "equal" else "the numbers differ in no simple pattern")
    unseen = unseen_precision(case, rel)
    if weights_right(case):  # the record rules the start weights out: name the candidates left
        inputs = (f"every rank's weights at step {case.step}, the first recorded, equal the reference's, so the data "
                  "a rank or micro-batch saw, their order, or the layer's math differs")
        causes = ("data", "model") + (("precision",) if unseen else ())
    else:  # the start weights only where the record did not show them equal to the reference's
        known = case.start is not None and not any(case.start.values())
        weights = "" if known else " the start weights (a seed, no broadcast),"
        inputs = f"the data a rank or micro-batch saw, their order,{weights} or the layer's math differs"
        causes = ()  # the backward's own bugs (a clip on one rank, zero_grad between micro-batches) fit too
    return Diagnosis(f"the {thing} differs on rank {case.rank} by {rel:.2g} {of}{loose(case)}",
                     f"{where}: {no_shape(case)}; {inputs}{stepped(case)}{unseen}",
                     "the inputs and targets each rank and each micro-batch gets (and their order between pipeline "
                     "stages), then record what='params' or a layer's output to find the first that differs",
                     shaped=False, causes=causes)


def _frozen(case: Case, thing: str) -> Diagnosis:
    """The recorder saw requires_grad=False on this rank's parameter, which the reference trains."""
    where = f"rank {case.rank}'s parameter {case.name} has requires_grad=False"
    if case.kind == "grad":
        what = f"{where}, so backward gave it no gradient, while the reference's has one"
    else:
        what = f"{where}, so the optimizer does not move it, while the reference's moves ({thing} differs)"
    return Diagnosis(what,
                     "the parameter is frozen in the run (requires_grad_(False), a layer frozen for fine-tuning) "
                     "and trained in the reference",
                     "where the run freezes parameters, and whether the reference should freeze the same ones",
                     causes=("frozen",))


def _param_differs(case: Case, rel: float, thing: str) -> Diagnosis:
    """A parameter in no shape: its update differs, which its gradient, the start weights or the optimizer can
    make, and so can Adam's division by sqrt(v) of float32's rounding: name all of them."""
    return Diagnosis(f"the {thing} differs on rank {case.rank} by {rel:.2g} of the tensor's largest value"
                     f"{loose(case)}",
                     f"the numbers differ in no simple pattern: {no_shape(case)}; an update differs: its gradient "
                     "(the data a rank saw, their order, the layer's math), the start weights (a seed, no "
                     "broadcast), or the optimizer (its learning rate, its settings, a step skipped on this rank); "
                     "or no bug at all: Adam and AdamW divide by sqrt(v), so a gradient element near zero turns "
                     f"float32's rounding into an update as large as the learning rate{unseen_precision(case, rel)}",
                     "record what='grads' for the same steps: gradients equal to the reference's rule out the data "
                     "and the backward and leave the optimizer (its settings, or Adam's amplified rounding where "
                     "the differences stay below the learning rate)",
                     shaped=False)

