"""``compare_runs``: a parallel run's records against a one-process reference's, step by step and name by name.

Each rank's piece of a tensor is compared with the same piece of the reference's, so the report can name the
rank whose piece is wrong, not only the tensor. Within a step the loss comes first, then the tensors: gradients
in the order backward computes them (the model's last parameters first), since a wrong gradient spreads to
every parameter backward reaches after it; parameters in the model's order.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

import torch

from ppkit.errors import ConfigError
from ppkit.parity.diagnose import Case, diagnose
from ppkit.parity.record import ParityRecorder, ParityRun, Piece
from ppkit.parity.report import Difference, ParityReport
from ppkit.parity.tolerance import Tolerance, chosen_tolerance, least_precise


def compare_runs(reference, runs, *, rtol: float | None = None, atol: float | None = None) -> ParityReport:
    """Compare ``runs`` (what ``cluster.run`` returned: each rank's ``ParityRecorder.run``, a list by rank, a
    dict, or one run; None for a rank that recorded nothing) with ``reference`` (a ``ParityRun`` or recorder
    of one process). The report's ``first`` names the first step, tensor and rank beyond tolerance, and says
    what happened, why it is likely and what to check. ``rtol``/``atol`` replace the default, which
    ``ppkit.parity.tolerance`` derives from the dtype and the reordered sums of a parallel run."""
    ref = _as_run(reference, "reference")
    if ref.world_size != 1:
        raise ConfigError(f"the reference was recorded on rank {ref.rank} of {ref.world_size}: record it in one "
                          "process (the kernel, no process group), as the run a parallel one must equal.")
    ranks = _as_runs(runs, ref.kind)
    steps = _common_steps(ref, ranks)
    dtypes = [ref.dtype] + [run.dtype for run in ranks.values()]
    tolerance = chosen_tolerance(least_precise(dtypes), rtol, atol)
    differences: list[Difference] = []
    first_case = None
    for step in steps:
        for diff, case in _step_differences(ref, ranks, step, tolerance):
            differences.append(diff)
            first_case = first_case or case
    diagnosis = diagnose(first_case) if first_case else None
    held = {n for run in ranks.values() for step in steps for n in run.tensors.get(step, {})}
    names = [n for n in dict.fromkeys(n for step in steps for n in ref.tensors.get(step, {})) if n in held]
    losses = any(run.losses for run in ranks.values())
    return ParityReport(differences, diagnosis, tolerance, steps, names, sorted(ranks), ref.kind, losses)


def _as_run(obj, label: str) -> ParityRun:
    if isinstance(obj, ParityRecorder):
        return obj.run
    if isinstance(obj, ParityRun):
        return obj
    raise ConfigError(f"compare_runs: the {label} is a {type(obj).__name__}; give what a ParityRecorder recorded "
                      "(recorder.run, returned from the rank function).")


def _as_runs(runs, kind: str) -> dict[int, ParityRun]:
    if isinstance(runs, (ParityRun, ParityRecorder)):
        runs = [runs]
    items = runs.values() if isinstance(runs, Mapping) else runs
    if not isinstance(items, (list, tuple, type({}.values()))):
        raise ConfigError(f"compare_runs: the parallel run is a {type(runs).__name__}; give the list cluster.run "
                          "returned (each rank's recorder.run).")
    found: dict[int, ParityRun] = {}
    for obj in items:
        if obj is None:
            continue
        run = _as_run(obj, "parallel run's entry")
        if run.rank in found:
            raise ConfigError(f"compare_runs: two runs say they are rank {run.rank}; give each rank's run once.")
        if run.kind != kind:
            raise ConfigError(f"rank {run.rank} recorded {run.kind}, the reference {kind}: record the same with "
                              f"ParityRecorder(what={kind!r}) on both sides.")
        found[run.rank] = run
    if not found:
        raise ConfigError("compare_runs: no rank recorded anything: return recorder.run from the rank function.")
    return dict(sorted(found.items()))


def _common_steps(ref: ParityRun, ranks: dict[int, ParityRun]) -> list[int]:
    for rank, run in ranks.items():
        extra = sorted(set(run.steps) - set(ref.steps))
        if extra:
            raise ConfigError(f"rank {rank} recorded steps {extra}, which the reference did not (it has "
                              f"{_span(ref.steps)}): run the reference for as many steps, numbered the same.")
    steps = sorted(set().union(*(run.steps for run in ranks.values())))
    if not steps:
        raise ConfigError("compare_runs: the ranks recorded no step: call recorder.record(step, model, loss) "
                          "once per step.")
    return steps


def _span(steps: list[int]) -> str:
    return f"steps {steps[0]}-{steps[-1]}" if steps else "no step"


def _step_differences(ref: ParityRun, ranks: dict[int, ParityRun], step: int, tolerance: Tolerance):
    loss_ok = False  # a loss was compared at this step and every rank's equals the reference's
    if step in ref.losses:
        want = torch.tensor(ref.losses[step], dtype=torch.float64)
        losses = {r: torch.tensor(run.losses[step], dtype=torch.float64)
                  for r, run in ranks.items() if step in run.losses}
        loss_ok = bool(losses)
        for rank, got in losses.items():
            diff = _difference("loss", "loss", step, rank, got, want, tolerance)
            if diff:
                loss_ok = False
                yield diff, Case("loss", "loss", step, rank, got, want, losses, {}, False,
                                 {r: (v, want) for r, v in losses.items()})
    elif any(step in run.losses for run in ranks.values()):
        raise ConfigError(f"the ranks recorded a loss at step {step}, the reference none: pass the loss to "
                          "record on both sides.")
    names = _names_at(ref, ranks, step)
    kind = ref.kind[:-1]  # "grad" or "param"
    for name in (reversed(names) if ref.kind == "grads" else names):
        full = ref.tensors[step][name].value
        held = {r: run.tensors[step][name] for r, run in ranks.items() if name in run.tensors.get(step, {})}
        wanted = {r: _wanted(full, piece, name, r) for r, piece in held.items()}
        _check_covered(full, held, name, step)
        for rank, piece in held.items():
            diff = _difference(kind, name, step, rank, piece.value, wanted[rank], tolerance)
            if diff:
                peers = {r: held[r].value for r in held if _same_place(held[r], piece)}
                elsewhere = {r: w for r, w in wanted.items() if w is not None and r != rank
                             and not _same_place(held[r], piece)}
                yield diff, Case(kind, name, step, rank, piece.value, wanted[rank], peers, elsewhere, loss_ok,
                                 {r: (held[r].value, wanted[r]) for r in held})


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


def _wanted(full: torch.Tensor | None, piece: Piece, name: str, rank: int) -> torch.Tensor | None:
    """The reference's part that ``piece`` should equal."""
    if full is None or piece.value is None:
        return full if piece.value is None or full is None else None
    shape = tuple(piece.value.shape)
    if piece.full_shape is not None:
        if tuple(full.shape) != piece.full_shape:
            raise ConfigError(f"rank {rank}'s {name} is a piece of a {list(piece.full_shape)} tensor, the "
                              f"reference's is {list(full.shape)}: the two models differ in size.")
        return full[tuple(slice(o, o + s) for o, s in zip(piece.offset, shape))]
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
                              f"{list(part.shape)}: check the shards= given to this rank's recorder.")
        return part
    if tuple(full.shape) != shape:
        raise ConfigError(f"rank {rank}'s {name} has shape {list(shape)}, the reference's {list(full.shape)}. If this "
                          f"rank holds a piece of it, say which: ParityRecorder(shards={{{name!r}: (dim, index, "
                          "count)}}); a DTensor says it by itself.")
    return full


def _check_covered(full: torch.Tensor | None, held: dict[int, Piece], name: str, step: int) -> None:
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
        raise ConfigError(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} recorded pieces of "
                          f"{name} at step {step} that cover {done} of its {full.numel()} elements: the rest was "
                          "not compared. Return recorder.run from every rank (not only from rank 0: each rank "
                          "records its own piece), and check the offsets or shards= the pieces were recorded with.")


def _same_place(a: Piece, b: Piece) -> bool:
    shape_a = None if a.value is None else tuple(a.value.shape)
    shape_b = None if b.value is None else tuple(b.value.shape)
    return (a.offset, a.chunk, shape_a) == (b.offset, b.chunk, shape_b) or a.gathered or b.gathered


def _difference(kind, name, step, rank, got, want, tolerance: Tolerance) -> Difference | None:
    if got is None and want is None:
        return None
    if got is None or want is None:
        return Difference(step, kind, name, rank, float("inf"), float("inf"), 0.0, tolerance.at(step)[0],
                          "no gradient" if got is None else "a gradient the reference has not")
    if got.numel() == 0:
        return None
    delta = (got.double() - want.double()).abs().max()
    scale = float(want.double().abs().max())
    diff = float(delta) if torch.isfinite(delta) else float("inf")
    if tolerance.allows(diff, scale, step):
        return None
    return Difference(step, kind, name, rank, diff, diff / scale if scale else float("inf"), scale,
                      tolerance.at(step)[0], "")
