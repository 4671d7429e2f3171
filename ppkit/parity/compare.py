"""``compare_runs``: a parallel run's records against a one-process reference's, step by step and name by name.

Each rank's piece of a tensor is compared with the same piece of the reference's, so the report can name the
rank whose piece is wrong, not only the tensor. Within a step the loss comes first, then the tensors: gradients
in the order backward computes them (the model's last parameters first), since a wrong gradient spreads to
every parameter backward reaches after it; parameters in the model's order. Each tensor is judged with the
tolerance of the precision it was computed in (tolerance.py), against the whole tensor's largest value.
"""

from __future__ import annotations

import difflib

import torch

from ppkit.errors import ConfigError
from ppkit.parity.amplified import allowance
from ppkit.parity.case import Case, Diagnosis
from ppkit.parity.diagnose import diagnose
from ppkit.parity.inputs import start_differences
from ppkit.parity.patterns import one_scale
from ppkit.parity.pieces import check_covered, same_place, wanted
from ppkit.parity.precision import least_precise
from ppkit.parity.record import ParityRun, Piece
from ppkit.parity.report import Difference, ParityReport, Used
from ppkit.parity.runs_given import absent_ranks, as_run, as_runs, common_steps
from ppkit.parity.tolerance import Tolerance, chosen_tolerance, default_tolerance


def compare_runs(reference, runs, *, rtol: float | None = None, atol: float | None = None) -> ParityReport:
    """Compare ``runs`` (what ``cluster.run`` returned: each rank's ``ParityRecorder.run``, a list by rank, a
    dict, or one run; None for a rank that recorded nothing) with ``reference`` (a ``ParityRun`` or recorder
    of one process). The report's ``first`` names the first step, tensor and rank beyond tolerance, and says
    what happened, why it is likely and what to check. ``rtol``/``atol`` replace the default, which
    ``ppkit.parity.tolerance`` derives from the dtype and the reordered sums of a parallel run."""
    ref = as_run(reference, "reference")
    if ref.world_size != 1:
        raise ConfigError(f"the reference was recorded on rank {ref.rank} of {ref.world_size}: record it in one "
                          "process (the kernel, no process group), as the run a parallel one must equal.")
    absent = absent_ranks(runs)
    ranks = as_runs(runs, ref.kind)
    steps = common_steps(ref, ranks)
    tolerances = _Tolerances(ref, ranks, rtol, atol)
    starts = start_differences(ref, ranks, rtol, atol)
    differences: list[Difference] = []
    untrained: dict[str, int] = {}  # parameter -> the first step where its start value would pass (_untrained_passes)
    first_cases: list = []  # every difference of the first step that has one
    for step in steps:
        for diff, case in _step_differences(ref, ranks, step, tolerances, absent, starts, untrained):
            differences.append(diff)
            if not first_cases or first_cases[0].step == step:
                first_cases.append(case)
    recorded = {(r, n) for r, run in ranks.items() for n in run.tensors.get(first_cases[0].step, {})} \
        if first_cases else set()
    diagnosis = _diagnosis(first_cases, recorded) if first_cases else None
    held = {n for run in ranks.values() for step in steps for n in run.tensors.get(step, {})}
    names = [n for n in dict.fromkeys(n for step in steps for n in ref.tensors.get(step, {})) if n in held]
    losses = any(run.losses for run in ranks.values())
    return ParityReport(differences, diagnosis, tolerances.used(), steps, names, sorted(ranks), ref.kind, losses,
                        list(tolerances.amplified), untrained, ref.start_step)


def _diagnosis(cases: list, recorded: set) -> Diagnosis:
    """The first difference's diagnosis; where that is a loss in no shape (one number rarely fits one), the first
    difference of the same step that has a shape, so that a loss judged first does not hide what the tensors
    show. A scale that one tensor's loose (bfloat16) tolerance cannot tell from other data is decided where every
    tensor of the step fits the same one (``recorded``: every (rank, name) recorded at that step)."""
    first = diagnose(cases[0])
    if first.causes and first.causes[-2:] == ("scale_other", "data"):
        first = one_scale([c for c in cases if c.kind != "loss"], recorded) or first
    if first.shaped or cases[0].kind != "loss":
        return first
    for case in cases[1:]:
        found = diagnose(case)
        if found.shaped:
            head = cases[0]
            what = {"loss": "loss", "grad": f"gradient {head.name}"}.get(head.kind, f"parameter {head.name}")
            return Diagnosis(f"{found.what} (the first difference, rank {head.rank}'s {what} at step {head.step}, "
                             "fits no shape by itself)", found.why, found.check, causes=found.causes)
    return first


class _Tolerances:
    """The tolerance of each precision, made once, and what each one judged (for the report)."""

    def __init__(self, ref: ParityRun, ranks: dict[int, ParityRun], rtol, atol):
        self.rtol, self.atol, self.judged = rtol, atol, {}
        self.why = {}
        for run in [ref, *ranks.values()]:
            for dtype, why in run.precision.items():
                self.why.setdefault(dtype, why)
        self.made: dict[str, Tolerance] = {}
        self.amplified: dict[str, None] = {}  # parameters given Adam's amplified rounding (amplified.py)

    def of(self, dtype: str, what: str) -> Tolerance:
        dtype = dtype or "torch.float32"
        if dtype not in self.made:
            self.made[dtype] = chosen_tolerance(dtype, self.rtol, self.atol)
        self.judged.setdefault(dtype, {})[what] = None
        return self.made[dtype]

    def used(self) -> list[Used]:
        return [Used(self.made[d], self.why.get(d, "the recorded dtype"), list(names))
                for d, names in self.judged.items()]


def _step_differences(ref: ParityRun, ranks: dict[int, ParityRun], step: int, tolerances: _Tolerances,
                      absent: list[int], starts: dict[int, list[str]] | None, untrained: dict[str, int]):
    computed = least_precise(*(run.computed.get(step, "") for run in [ref, *ranks.values()]))
    inputs = dict(start=starts, start_step=ref.start_step,  # what the forward was given (inputs.py)
                  own_losses={r: run.own_losses[step] for r, run in ranks.items() if step in run.own_losses})
    forward = ""  # "equal": every rank's loss equals the reference's to float32's rounding; "loose": within
    loss_rel = None  # the tolerance only (a bf16 one, say), which does not show that the forward is right
    loss_dtype = ""
    loss_differs = False
    if step in ref.losses:
        want = torch.tensor(ref.losses[step], dtype=torch.float64)
        losses = {r: torch.tensor(run.losses[step], dtype=torch.float64)
                  for r, run in ranks.items() if step in run.losses}
        ok = bool(losses)
        for rank, got in losses.items():
            dtype = least_precise(ref.loss_dtypes.get(step, ""), ranks[rank].loss_dtypes.get(step, ""), computed)
            tolerance = tolerances.of(dtype, "loss")
            loss_dtype = least_precise(loss_dtype, tolerance.dtype)
            diff = _difference("loss", "loss", step, rank, got, want, tolerance, float(want.abs()))
            if diff:
                ok = False
                yield diff, Case("loss", "loss", step, rank, got, want, losses, {},
                                 {r: (v, want) for r, v in losses.items()}, tolerance,
                                 graph=ranks[rank].graphs.get(step, ""),
                                 matched_before=step - 1 in ranks[rank].steps, loss_differs=True,
                                 dp_size=ranks[rank].dp_size, world_size=ranks[rank].world_size, **inputs)
        loss_differs = bool(losses) and not ok
        if ok:
            loss_rel = max(float((v - want).abs()) / max(float(want.abs()), 1e-30) for v in losses.values())
            exact = default_tolerance("torch.float32").at(step)[0]
            forward = "equal" if loss_rel <= exact else "loose"
    elif any(step in run.losses for run in ranks.values()):
        raise ConfigError(f"the ranks recorded a loss at step {step}, the reference none: pass the loss to "
                          "record on both sides.")
    names = _names_at(ref, ranks, step)
    kind = ref.kind[:-1]  # "grad" or "param"
    for name in (reversed(names) if ref.kind == "grads" else names):
        full = ref.tensors[step][name].value
        held = {r: run.tensors[step][name] for r, run in ranks.items() if name in run.tensors.get(step, {})}
        wants = {r: wanted(full, piece, name, r) for r, piece in held.items()}
        check_covered(full, held, name, step, absent)
        scale = float(full.double().abs().max()) if full is not None and full.numel() else 0.0
        frees: dict[Tolerance, torch.Tensor | None] = {}  # Adam's amplified rounding, per precision compared in
        for rank, piece in held.items():
            dtype = least_precise(_dtype(ref.tensors[step][name]), _dtype(piece), computed)
            tolerance = tolerances.of(dtype, name)
            if ref.kind == "params" and tolerance not in frees:
                frees[tolerance] = allowance(ref, step, name, tolerance)
            free = frees.get(tolerance)
            if free is not None:
                tolerances.amplified.setdefault(name, None)
            allowed = None if free is None or piece.value is None else wanted(free, piece, name, rank)
            diff = _difference(kind, name, step, rank, piece.value, wants[rank], tolerance, scale, allowed)
            if ref.kind == "params" and name not in untrained and _untrained_passes(ref, step, name, piece, rank,
                                                                                     wants[rank], tolerance, scale,
                                                                                     allowed):
                untrained[name] = step
            if diff:
                peers = {r: held[r].value for r in held if same_place(held[r], piece)}
                elsewhere = {r: w for r, w in wants.items() if w is not None and r != rank
                             and not same_place(held[r], piece)}
                other_steps = {t: wanted(ref.tensors[t][name].value, piece, name, rank) for t in ref.tensors
                           if ref.kind == "params" and t != step and name in ref.tensors[t]
                           and ref.tensors[t][name].value is not None}
                no_grads = all(p.value is None for p in ranks[rank].tensors[step].values())
                yield diff, Case(kind, name, step, rank, piece.value, wants[rank], peers, elsewhere,
                                 {r: (held[r].value, wants[r]) for r in held}, tolerance, forward, loss_rel,
                                 other_steps, no_grads, step in ranks[rank].losses, ranks[rank].dp_size,
                                 ranks[rank].world_size, scale, loss_dtype, ranks[rank].graphs.get(step, ""),
                                 name in ranks[rank].tensors.get(step - 1, {}), loss_differs,
                                 frozen=name in ranks[rank].frozen.get(step, ()), **inputs)


def _untrained_passes(ref: ParityRun, step: int, name: str, piece: Piece, rank: int, want, tolerance: Tolerance,
                      scale: float, allowed) -> bool:
    """The reference's parameter moved since its first recorded step, yet that first value would pass at ``step``:
    the tolerance (bfloat16's grows to 0.28 of a tensor's largest value by step 19) exceeds the reference's own
    change, so a run in which this parameter never trained would be called equal here."""
    first = ref.tensors.get(ref.start_step, {}).get(name) if ref.start_step is not None else None
    if step == ref.start_step or first is None or first.value is None or want is None:
        return False
    start = wanted(first.value, piece, name, rank)
    if start is None or start.shape != want.shape or torch.equal(start, want):
        return False
    return _difference("param", name, step, rank, start, want, tolerance, scale, allowed) is None


def _dtype(piece: Piece) -> str:
    return piece.dtype or ("" if piece.value is None else str(piece.value.dtype))


def _names_at(ref: ParityRun, ranks: dict[int, ParityRun], step: int) -> list[str]:
    recorded = {r: run.tensors[step] for r, run in ranks.items() if step in run.tensors}
    if not recorded:
        return []
    if step not in ref.tensors:
        raise ConfigError(f"the ranks recorded tensors at step {step}, the reference none: pass the model to "
                          "record on both sides.")
    known = list(ref.tensors[step])
    for rank, pieces in recorded.items():
        unknown = [n for n in pieces if n not in ref.tensors[step]]
        if unknown:
            raise ConfigError(f"rank {rank} recorded {unknown[:3]} at step {step}, names the reference does not "
                              f"have{_suggest(unknown[0], known)}. Give the recorder rename= (a dict or a function) "
                              "to map this model's names to the reference's.")
    held = set().union(*recorded.values())
    missing = [n for n in known if n not in held]
    if missing:
        raise ConfigError(f"no rank recorded {missing[:3]} at step {step}{' and more' if len(missing) > 3 else ''}, "
                          "which the reference has: every parameter must be recorded by the rank or stage that "
                          "holds it (a pipeline stage records its own), under the reference's name.")
    return known


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" (the closest it has: {close[0]!r})" if close else ""


def _difference(kind, name, step, rank, got, want, tolerance: Tolerance, scale: float,
                allowed: torch.Tensor | None = None) -> Difference | None:
    """A difference beyond ``tolerance``, measured against ``scale``: the whole reference tensor's largest
    |value| (a loss: its own size); ``allowed``: per element, what Adam's amplified rounding may add
    (amplified.py)."""
    if got is None and want is None:
        return None
    if got is None or want is None:
        return Difference(step, kind, name, rank, float("inf"), float("inf"), 0.0, tolerance.bound(scale, step),
                          "no gradient" if got is None else "a gradient the reference has not")
    if got.numel() == 0:
        return None
    delta = (got.double() - want.double()).abs()
    if allowed is not None and allowed.shape == delta.shape:
        delta = (delta - allowed).clamp(min=0)
    delta = delta.max()
    diff = float(delta) if torch.isfinite(delta) else float("inf")
    if tolerance.allows(diff, scale, step):
        return None
    bound = tolerance.bound(scale, step)
    return Difference(step, kind, name, rank, diff, diff / scale if scale else float("inf"), scale,
                      bound / scale if scale else bound, "")
