"""What a forward is given, read from the record: the weights each rank started from and, through each rank's own
loss, whether the ranks saw the same batch. A difference at the first step recorded has no optimizer step before
it: where the weights are the reference's, the batch or the model's math differs; where they are not, the start
weights do.

``start_differences`` compares the parameters each rank recorded at its first step (kept beside the gradients, or
the parameters recorded) with the reference's; ``start_weights`` and ``same_batch`` turn that, and the ranks' own
losses, into a Diagnosis, or None where the record does not decide it; ``weights_right`` says where the weights
are ruled out, for the words of a difference in no shape.
"""

from __future__ import annotations

from ppkit.parity.case import Case, Diagnosis
from ppkit.parity.pieces import wanted
from ppkit.parity.precision import least_precise
from ppkit.parity.record import ParityRun, Piece
from ppkit.parity.tolerance import chosen_tolerance, default_tolerance


def start_differences(ref: ParityRun, ranks: dict[int, ParityRun], rtol, atol) -> dict[int, list[str]] | None:
    """rank -> the names of the parameters whose value at the first step differs from the reference's (every
    rank listed, an empty list where all equal); None where the record cannot say (no parameters kept, or not at
    the same first step)."""
    want = _start(ref)
    if not want:
        return None
    found: dict[int, list[str]] = {}
    for rank, run in ranks.items():
        got = _start(run)
        if not got or run.start_step != ref.start_step:
            return None
        differ = []
        for name, piece in got.items():
            full = want.get(name)
            if full is None or full.value is None or piece.value is None:
                continue
            part = wanted(full.value, piece, name, rank)
            dtype = least_precise(str(part.dtype), str(piece.value.dtype))
            tolerance = chosen_tolerance(dtype, rtol, atol)
            scale = float(full.value.double().abs().max()) if full.value.numel() else 0.0
            if part.numel() and not tolerance.allows(float((piece.value.double() - part.double()).abs().max()),
                                                     scale, 0):
                differ.append(name)
        found[rank] = differ
    return found


def _start(run: ParityRun) -> dict[str, Piece]:
    if run.start_step is None:
        return {}
    if run.kind == "params":
        return run.tensors.get(run.start_step, {})
    return run.start


def start_weights(case: Case) -> Diagnosis | None:
    """Ranks whose weights at the first recorded step differ from the reference's, where the loss at that step
    differs too (a forward run with other weights; recorded after the optimizer's step, the weights would differ
    while the loss, computed before it, matched)."""
    if case.start is None or case.step != case.start_step or not any(case.start.values()):
        return None
    if case.kind != "param" and (case.forward == "equal" or not case.loss_differs):
        return None
    ranks = sorted(r for r, names in case.start.items() if names)
    same = sorted(r for r, names in case.start.items() if not names)
    names = case.start[ranks[0]]
    listed = ", ".join(names[:3]) + (" and more" if len(names) > 3 else "")
    agree = f" (rank{'s' if len(same) > 1 else ''} {_ranks(same)}'s equal them)" if same else ""
    return Diagnosis(f"{_whose(ranks)} parameters at step {case.step}, the first step recorded and before any "
                     f"optimizer step, differ from the reference's ({listed})",
                     f"the ranks did not start from the reference's weights{agree}, so every forward from the first "
                     "differs: "
                     "most likely each rank built its model from its own seed (torch.manual_seed(rank)) and nothing "
                     "broadcast rank 0's weights (DDP does at construction; data parallel by hand must)",
                     "that every rank seeds the same before building the model, or broadcasts rank 0's parameters "
                     "(dist.broadcast(p.data, src=0) for each) before the first step", causes=("init",))


def _whose(ranks: list[int]) -> str:
    return f"rank {ranks[0]}'s" if len(ranks) == 1 else f"ranks {_ranks(ranks)}'"


def same_batch(case: Case) -> Diagnosis | None:
    """The weights equal the reference's at the first step and the loss differs: the forward's other input, the
    batch, or the model's math differs; every data-parallel rank's own loss being the same number says the ranks
    computed it on the same batch."""
    if not weights_right(case):
        return None
    own = case.own_losses
    exact = default_tolerance("torch.float32").at(case.step)[0]
    if len(own) > 1 and (case.dp_size or 0) > 1:
        values = list(own.values())
        if all(abs(v - values[0]) <= exact * max(abs(values[0]), 1e-30) for v in values):
            return Diagnosis(f"every rank's own loss at step {case.step} is the same number ({values[0]:.6g}, ranks "
                             f"{_ranks(sorted(own))}), and their weights at that step, the first recorded, equal the "
                             "reference's",
                             "the ranks computed their loss on the same batch, where each data-parallel rank should "
                             "take its own part of it: a DistributedSampler built without rank= (or a shard taken "
                             "with a fixed index), or a loader seeded alike on every rank. (If the loss given to "
                             "record had already been averaged over the ranks, this does not follow: record wants "
                             "each rank's own loss, and mean_over= averages it)",
                             "the part of each batch every rank takes: DistributedSampler(dataset, num_replicas="
                             "world_size, rank=rank), or batch.chunk(world_size)[rank]", causes=("data",))
    return None


def weights_right(case: Case) -> bool:
    """Every rank's weights at the first recorded step equal the reference's, this is that step, and the loss
    differs there: with no optimizer step before it, the forward's other input (the batch) or its math differs."""
    return (case.start is not None and case.step == case.start_step and not any(case.start.values())
            and case.forward != "equal" and case.loss_differs)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
