"""What ``compare_runs`` found: every difference beyond tolerance, the first one named in words."""

from __future__ import annotations

from dataclasses import dataclass

from ppkit.errors import ParityError
from ppkit.parity.case import Diagnosis
from ppkit.parity.tolerance import Tolerance

SHOWN = 6  # differences listed after the first one's explanation


@dataclass(frozen=True)
class Difference:
    """One rank's loss or tensor at one step, beyond tolerance. ``abs_diff``: the largest absolute
    difference; ``rel_diff``: that over ``scale``, the largest absolute value of the reference's whole tensor
    (a loss: the reference's loss); ``allowed``: the largest ``rel_diff`` the tolerance allows at this step, atol
    included (an all-zero reference: the largest ``abs_diff``); ``note``: "no gradient" and the like,
    where no number says it."""

    step: int
    kind: str          # "loss", "grad" or "param"
    name: str          # "loss" for a loss
    rank: int
    abs_diff: float
    rel_diff: float
    scale: float
    allowed: float
    note: str = ""

    def __str__(self) -> str:
        what = "loss" if self.kind == "loss" else f"{'gradient' if self.kind == 'grad' else 'parameter'} {self.name}"
        of = "the reference's loss" if self.kind == "loss" else "the tensor's largest value"
        size = self.note or (f"|diff| {self.abs_diff:.3g} = {self.rel_diff:.3g} of {of} {self.scale:.3g}"
                             if self.kind == "loss" else
                             f"max |diff| {self.abs_diff:.3g} = {self.rel_diff:.3g} of {of} {self.scale:.3g}")
        allowed = "" if self.note else f" (allowed {self.allowed:.2g})"
        return f"step {self.step}, {what}, rank {self.rank}: {size}{allowed}"


@dataclass(frozen=True)
class Used:
    """A tolerance the comparison used, why (the precision the run computed in), and what it judged."""

    tolerance: Tolerance
    why: str
    judged: list[str]  # "loss" and tensor names

    def __str__(self) -> str:
        names = [n for n in self.judged if n != "loss"]
        what = (["the loss"] if "loss" in self.judged else []) + ([f"{len(names)} tensor(s)"] if names else [])
        dtype = self.tolerance.dtype.removeprefix("torch.")
        return f"{' and '.join(what)} within {self.tolerance} ({dtype}: {self.why})".replace(f" ({dtype}) (", " (")


class ParityReport:
    """``equal``: every loss and tensor within tolerance. Otherwise ``first`` (a ``Difference``) names the first
    step, tensor and rank, and ``diagnosis`` says what happened, why it is likely and what to check;
    ``differences`` lists them all. ``raise_if_different()`` raises ``ppkit.ParityError`` with the same text.
    ``tolerances``: each tolerance used, why, and what it judged; ``tolerance``: the loosest of them."""

    def __init__(self, differences: list[Difference], diagnosis: Diagnosis | None, tolerances: list[Used],
                 steps: list[int], names: list[str], ranks: list[int], kind: str, losses: bool = True,
                 amplified: list[str] | None = None, cannot_tell: dict[str, int] | None = None,
                 start_step: int | None = None):
        self.differences = list(differences)
        self.diagnosis = diagnosis
        self.tolerances = sorted(tolerances, key=lambda u: u.tolerance.rtol)
        self.steps, self.names, self.ranks, self.kind = steps, names, ranks, kind
        self.losses = losses  # whether any rank recorded a loss
        self.amplified = list(amplified or [])  # parameters given Adam's amplified rounding (parity/amplified.py)
        # parameter -> the first step at which its value at the first recorded step would have passed, though the
        # reference's had moved: there the comparison cannot tell a run in which it never trained
        self.cannot_tell = dict(cannot_tell or {})
        self.start_step = start_step

    @property
    def tolerance(self) -> Tolerance | None:
        return self.tolerances[-1].tolerance if self.tolerances else None

    def _within(self) -> str:
        within = "; ".join(map(str, self.tolerances)) or "no tolerance (nothing compared)"
        if self.amplified:
            listed = ", ".join(self.amplified[:3]) + (" and more" if len(self.amplified) > 3 else "")
            within += (f"; besides, the elements of {listed} whose reference gradient was zero but for rounding may "
                       "differ by up to twice the reference's largest update per such step (Adam's update of such "
                       "an element is float32's rounding divided by itself)")
        return within

    def _unseen(self) -> str:
        """What a tolerance looser than float32's let pass unseen: an "equal" under bf16 is no proof of a 5 % bug's
        absence."""
        loose = [u.tolerance for u in self.tolerances
                 if u.tolerance.dtype not in ("torch.float32", "torch.float64", "")]
        if not loose:
            return ""
        worst, last = loose[-1], self.steps[-1]
        first, end = worst.at(self.steps[0])[0], worst.at(last)[0]
        dtype = worst.dtype.removeprefix("torch.")
        at_end = f" and {end:.2g} at step {last}" if end != first else ""
        measured = " (measured: a gradient 5 % too large on every rank)" if dtype == "bfloat16" else ""
        return (f" Within {dtype}'s rounding it cannot see a difference up to {first:.2g} of a tensor's largest "
                f"value at step {self.steps[0]}{at_end}: a bug that small passes unseen{measured}; compare in "
                "float32 to rule it out.")

    def _untrained(self) -> str:
        """Where the tolerance exceeds the reference's own change since the first step, an equal there says
        nothing about whether the run trained: say so, for those parameters."""
        if not self.cannot_tell:
            return ""
        names = sorted(self.cannot_tell, key=lambda n: (self.cannot_tell[n], n))
        listed = ", ".join(f"{n} (from step {self.cannot_tell[n]})" for n in names[:4]) + (
            f" and {len(names) - 4} more" if len(names) > 4 else "")
        return (f" It cannot tell whether the run trained {listed}: there the tolerance exceeds the reference's own "
                f"change since step {self.start_step}, so a run whose parameters never moved (optimizer.step() "
                "never called, updates rounded away in bfloat16 weights) would pass as equal; compare in float32, "
                "or with a learning rate or a number of steps that moves the reference further than the tolerance.")

    @property
    def equal(self) -> bool:
        return not self.differences

    @property
    def first(self) -> Difference | None:
        return self.differences[0] if self.differences else None

    def __bool__(self) -> bool:
        return self.equal

    def __str__(self) -> str:
        kind = {"grads": "gradients", "params": "parameters"}.get(self.kind, self.kind)
        what = [w for w, on in (("the loss", self.losses), (f"{len(self.names)} {kind} by name", self.names)) if on]
        compared = f"{len(self.steps)} step(s), {' and '.join(what)}, ranks {_ranges(self.ranks)}"
        if self.equal:
            return (f"parity: the parallel run equals the reference ({compared}): {self._within()}.{self._unseen()}"
                    f"{self._untrained()}")
        first, d = self.first, self.diagnosis
        lines = [f"parity: the parallel run differs from the reference first at {first}.",
                 f"  What: {d.what}.", f"  Why it is likely: {d.why}.", f"  Check: {d.check}."]
        rest = self.differences[1:]
        if rest:
            lines.append(f"  {len(rest)} more difference(s); the next:")
            lines += [f"    {diff}" for diff in rest[:SHOWN]]
            if len(rest) > SHOWN:
                lines.append(f"    ... (report.differences has all {len(self.differences)})")
        lines.append(f"  Compared {compared}: {self._within()}.{self._untrained()}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ParityReport {'equal' if self.equal else 'differs at ' + str(self.first)}>"

    def _repr_pretty_(self, printer, cycle) -> None:  # a notebook shows the sentences, not the repr
        printer.text(str(self))

    def raise_if_different(self) -> ParityReport:
        """Raise ``ppkit.ParityError`` with this report's text when the runs differ; return the report otherwise."""
        if not self.equal:
            raise ParityError(str(self), self)
        return self


def _ranges(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))
