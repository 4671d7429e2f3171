"""What the diagnosis is given and what it gives: a Case (the first difference, and every value the record holds
that it can be compared with) and a Diagnosis (what happened, why it is likely, what to check)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ppkit.parity.causes import known
from ppkit.parity.tolerance import Tolerance


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
    loss_differs: bool = False                 # some rank's loss at this step differs from the reference's
    start: dict[int, list[str]] | None = None  # rank -> parameters whose first recorded value differs (None: unknown)
    start_step: int | None = None              # the first step recorded with a model
    own_losses: dict[int, float] = field(default_factory=dict)  # rank -> its own loss at this step (mean_over)
    frozen: bool = False                       # this rank's parameter had requires_grad=False when recorded


@dataclass(frozen=True)
class Diagnosis:
    """What happened, why it is likely and what to check, in words; ``causes``: the identifiers
    (ppkit.parity.causes.CAUSES) of every cause the numbers fit, the likeliest first: one where the record decides
    it, several where it cannot tell them apart, none where no shape fits."""

    what: str
    why: str
    check: str
    shaped: bool = True                        # False: no shape fits (the words say what to compare next)
    causes: tuple[str, ...] = ()

    def __post_init__(self):
        known(self.causes)

    @property
    def cause(self) -> str | None:
        """The cause, where the record decides it; None where several fit or none does."""
        return self.causes[0] if len(self.causes) == 1 else None

    @property
    def unsure(self) -> bool:
        """The record cannot tell which cause it is (several fit, or none)."""
        return len(self.causes) != 1


def noun(case: Case) -> str:
    """The tensor the case is about, in words: "loss", "gradient of w", "parameter w"."""
    return {"loss": "loss", "grad": f"gradient of {case.name}"}.get(case.kind, f"parameter {case.name}")

