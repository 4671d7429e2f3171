"""What ``compare_runs`` found: every difference beyond tolerance, the first one named in words."""

from __future__ import annotations

from dataclasses import dataclass

from ppkit.errors import ParityError
from ppkit.parity.diagnose import Diagnosis
from ppkit.parity.tolerance import Tolerance

SHOWN = 6  # differences listed after the first one's explanation


@dataclass(frozen=True)
class Difference:
    """One rank's loss or tensor at one step, beyond tolerance. ``abs_diff``: the largest absolute
    difference; ``rel_diff``: that over ``scale``, the reference's largest absolute value; ``rtol``: the
    tolerance at this step; ``note``: "no gradient" and the like, where no number says it."""

    step: int
    kind: str          # "loss", "grad" or "param"
    name: str          # "loss" for a loss
    rank: int
    abs_diff: float
    rel_diff: float
    scale: float
    rtol: float
    note: str = ""

    def __str__(self) -> str:
        what = "loss" if self.kind == "loss" else f"{'gradient' if self.kind == 'grad' else 'parameter'} {self.name}"
        size = self.note or (f"max |diff| {self.abs_diff:.3g} = {self.rel_diff:.3g} of its largest value "
                             f"{self.scale:.3g}")
        allowed = "" if self.note else f" (allowed {self.rtol:.2g})"
        return f"step {self.step}, {what}, rank {self.rank}: {size}{allowed}"


class ParityReport:
    """``equal``: every loss and tensor within tolerance. Otherwise ``first`` (a ``Difference``) names the first
    step, tensor and rank, and ``diagnosis`` says what happened, why it is likely and what to check;
    ``differences`` lists them all. ``raise_if_different()`` raises ``ppkit.ParityError`` with the same text."""

    def __init__(self, differences: list[Difference], diagnosis: Diagnosis | None, tolerance: Tolerance,
                 steps: list[int], names: list[str], ranks: list[int], kind: str, losses: bool = True):
        self.differences = list(differences)
        self.diagnosis = diagnosis
        self.tolerance, self.steps, self.names, self.ranks, self.kind = tolerance, steps, names, ranks, kind
        self.losses = losses  # whether any rank recorded a loss

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
            return f"parity: the parallel run equals the reference ({compared}), within {self.tolerance}."
        first, d = self.first, self.diagnosis
        lines = [f"parity: the parallel run differs from the reference first at {first}.",
                 f"  What: {d.what}.", f"  Why it is likely: {d.why}.", f"  Check: {d.check}."]
        rest = self.differences[1:]
        if rest:
            lines.append(f"  {len(rest)} more difference(s); the next:")
            lines += [f"    {diff}" for diff in rest[:SHOWN]]
            if len(rest) > SHOWN:
                lines.append(f"    ... (report.differences has all {len(self.differences)})")
        lines.append(f"  Compared {compared}, within {self.tolerance}.")
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
