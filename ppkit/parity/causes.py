"""The causes a parity diagnosis can name: a short identifier each, stable across releases (what a program, a
notebook cell or a grader reads), and a few words a learner reads. A diagnosis lists every cause its numbers fit;
more than one means the record cannot tell them apart, none means no shape fitted (its words say what was seen).

    report.diagnosis.causes        # ("skipped_step",), or ("lr", "step_grad") where either fits
    ppkit.parity.causes.CAUSES["lr"]
"""

from __future__ import annotations

CAUSES = {
    # nothing reached a gradient
    "grads_none": "record ran while .grad was None: after optimizer.zero_grad(), or before loss.backward()",
    "wrong_model": "the model recorded is not the one that was trained",
    "detached": "a pipeline stage's output was detached or dropped, or the gradient sent back was never used",
    "unused_param": "the parameter was not used in this rank's forward",
    "frozen": "the parameter is frozen (requires_grad=False) on one side, or unused in the reference",
    "zeroed": "the gradient was zeroed before record or before optimizer.step(), or received into a buffer that "
              "was never filled",
    "nonfinite": "an overflow (a low-precision dtype, a loss scale) or a division by zero",
    # the optimizer
    "skipped_step": "a rank skipped optimizer.step() (a branch on the rank, an early continue, a GradScaler)",
    "not_in_optimizer": "the optimizer does not hold this parameter (built before wrapping the model)",
    "record_point": "the parameters were recorded at another point of the loop than the reference's",
    "extra_step": "a rank stepped more times than the reference",
    "lr": "the learning rate (or an optimizer setting that scales the update) differs on this rank",
    "step_grad": "the gradient this rank's optimizer stepped with was scaled (after it was recorded, or on "
                 "this rank only)",
    # collectives and sharding
    "sum_not_mean": "a data-parallel all_reduce that summed where it should average",
    "mean_not_sum": "an average where a sum belongs (a tensor-parallel all_reduce must sum)",
    "divided_twice": "a division by the world size too many (DDP and FSDP average already)",
    "accumulation": "gradient accumulation whose micro-batch losses were not divided by their number",
    "loss_scale": "the loss was scaled before backward (summed where the reference takes a mean)",
    "scale_other": "a factor on the loss or the gradients (normalisation, accumulation, a loss scale)",
    "partial": "an all_reduce missing: each rank holds only its own part of the tensor",
    "backward_allreduce": "an all_reduce missing in the backward of a tensor-parallel block (Megatron's f)",
    "dp_missing": "the data-parallel all_reduce of the gradients is missing",
    "wrong_group": "an all_reduce over the wrong process group",
    "swapped": "the shards are swapped: a piece was cut with another rank's index",
    "one_rank": "code that runs on one rank only changed its piece",
    "loss_parts": "each rank's loss was divided by the number of ranks and then not all_reduced",
    "loss_own": "each rank recorded its own batch's loss (mean_over= missing)",
    # what the ranks started from
    "drift": "ranks that should agree drifted apart (a skipped collective or optimizer step, other data, other "
             "start weights)",
    "init": "the ranks did not start from the reference's weights (a seed per rank, no broadcast)",
    "data": "the data a rank saw differs from its part of the reference's batch (a sampler, a shard, the order)",
    "model": "the model's own math differs (a layer, dropout, the loss function)",
    "precision": "no bug: a lower precision's rounding (bfloat16) that the recorder did not see",
}


def known(causes: tuple[str, ...]) -> tuple[str, ...]:
    """``causes`` unchanged, once each is known (a typo here would hand a grader or a notebook a name it cannot
    look up)."""
    unknown = [c for c in causes if c not in CAUSES]
    if unknown:
        raise ValueError(f"unknown parity cause(s) {unknown}: add them to ppkit.parity.causes.CAUSES")
    return tuple(causes)
