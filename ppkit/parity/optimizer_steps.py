"""What the optimizer did, read from a parameter: an update skipped (or recorded after it), an update c x the
reference's (the learning rate), and, after a step where everything matched, the step between as a cause."""

from __future__ import annotations

from ppkit.parity.case import Case, Diagnosis
from ppkit.parity.fit import UNIT, as_factor


def updated(case: Case, got, want, thing: str) -> Diagnosis | None:
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
    factor = f"{round(c)}x" if abs(c - round(c)) < UNIT else as_factor(c)
    return Diagnosis(f"rank {case.rank}'s {thing} equalled the reference's at step {case.step - 1}, and its change "
                     f"since (its value minus the reference's at step {case.step - 1}) is {factor} the reference's "
                     "update",
                     f"the optimizer step between them was {factor} larger on rank {case.rank}: most likely its "
                     f"learning rate is {factor} the reference's (an optimizer or scheduler built otherwise on this "
                     "rank), or, with SGD, the gradient it stepped with was scaled after it was recorded",
                     f"the optimizer rank {case.rank} builds (lr, scheduler, weight decay) against the reference's; "
                     f"record what='grads' at step {case.step - 1}: gradients that equal the reference's point at "
                     "the optimizer", causes=("lr", "step_grad"))


def skipped(case: Case, got, thing: str) -> Diagnosis | None:
    """A parameter equal to the reference's value at another step: the nearest earlier one (that rank missed the
    updates since), else a later one (it took updates the reference had not yet, or records after the step)."""
    if case.kind != "param":
        return None
    order = sorted((t for t in case.other_steps if t < case.step), reverse=True) + \
        sorted(t for t in case.other_steps if t > case.step)
    for step in order:
        other = case.other_steps[step]
        if other is None or other.shape != got.shape or not _nearer(case, got, other.double()):
            continue
        what = f"rank {case.rank}'s {thing} at step {case.step} equals the reference's value at step {step}"
        if step > case.step:
            return Diagnosis(what, "this rank records the parameters at another point of the loop than the "
                                   "reference (after optimizer.step() here, before it there), or it stepped "
                                   f"{step - case.step} more time(s) than the reference",
                             "where record is called on both sides: after backward and before optimizer.step()",
                             causes=("record_point", "extra_step"))
        missed = case.step - step
        still = ("; or the step ran and did not move it: a learning rate of 0 on this rank (a warmup that starts "
                 "at 0), or gradients zeroed before optimizer.step() (zero_grad in the wrong place). A parameter "
                 "that did not move looks the same whichever it was, and the record cannot tell them apart (with "
                 "Adam or momentum a step that ran still moved the optimizer's state, which only the next steps' "
                 "updates show, not which of these it was)")
        if missed == 1 and _updated_before(case):
            return Diagnosis(what, f"the parameter missed the update between steps {step} and {case.step}: rank "
                                   f"{case.rank} skipped optimizer.step() (a branch on the rank, an early continue, "
                                   f"a GradScaler that found inf and skipped it){still}. It equalled the reference's "
                                   f"at step {step}, after an update from step {step - 1}, so its optimizer holds it "
                                   "and it is recorded at the reference's point of the loop",
                             "that every rank calls optimizer.step() at every step (no branch on the rank or on a "
                             "condition that can differ between ranks), with this rank's learning rate at that "
                             "step, and that zero_grad comes after it",
                             causes=("skipped_step", "lr", "step_grad", "zeroed"))
        return Diagnosis(what,
                         f"the parameter missed {missed} update{'s' if missed > 1 else ''}: most likely rank "
                         f"{case.rank} skipped optimizer.step() (a branch on the rank, an early continue, a "
                         "GradScaler that found inf and skipped it), or its optimizer does not hold this "
                         "parameter; or this rank records the parameters at another point of the loop than the "
                         f"reference (before optimizer.step() here, after it there){still}",
                         "that every rank calls optimizer.step() at every step with its learning rate, that the "
                         "optimizer was built over this model's parameters (after wrapping it), and that zero_grad "
                         "comes after the step",
                         causes=("skipped_step", "not_in_optimizer", "record_point", "lr", "step_grad", "zeroed"))
    return None


CLEAR = 2  # "clearly": the other step's value at least this many times nearer, its update this many tolerances


def _nearer(case: Case, got, other) -> bool:
    """``got`` equals the reference's value ``other`` of another step, and the record can tell that from equalling
    the current one: ``got`` is CLEAR times nearer to it than to the current value, and the reference's update
    between the two is CLEAR times the tolerance. Where the tolerance exceeds an update (bfloat16 over a few steps
    of a small learning rate) every parameter "equals" the earlier value and that says nothing."""
    bound = case.tolerance.bound(case.scale, case.step)
    to_other = float((got - other).abs().max())
    to_current = float((got - case.want.double()).abs().max())
    update = float((case.want.double() - other).abs().max())
    return to_other <= bound and CLEAR * to_other < to_current and update > CLEAR * bound


def _updated_before(case: Case) -> bool:
    """The rank's parameter equalled the reference's at the step before, and the reference's had moved between
    the two steps before: this rank's optimizer updated it then (it holds it), and it was recorded at the
    reference's point of the loop (recorded one update late, it would have equalled the value before)."""
    before, earlier = case.other_steps.get(case.step - 1), case.other_steps.get(case.step - 2)
    if not case.matched_before or before is None or earlier is None or before.shape != earlier.shape:
        return False
    moved = float((before.double() - earlier.double()).abs().max())
    return not case.tolerance.allows(moved, case.scale, case.step)


def stepped(case: Case) -> str:
    """After a step where everything matched, the optimizer step between is as likely a cause as the data."""
    if not case.matched_before:
        return ""
    return (f"; or the optimizer step between: everything this rank recorded at step {case.step - 1} matched the "
            "reference, so its parameters may have been updated otherwise since (a learning rate or optimizer "
            "setting of its own, an optimizer.step() skipped on a rank; record what='params' to see it)")

