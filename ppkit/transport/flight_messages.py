"""The control-channel messages of a rank's flight record (flight_record.py), held to the same rules
as messages.py (small frozen dataclasses of plain fields; tests/test_hang_doctor.py checks them).

    controller  -> worker       AskFlightRecord (the collective doctor: ppkit/cluster/hang_doctor/)
    worker      -> controller   FlightRecord, its answer; also unasked, once, as gloo aborts the process
                                or as it ends after its last job (ppkit.spawn, %%torchrun)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AskFlightRecord:
    """Send your flight record: torch's record of your recent collectives, and where you wait."""


@dataclass(frozen=True)
class FlightRecord:
    """A rank's ``flight_record.snapshot`` (its JSON text) while running ``job_id`` (None: between
    jobs); ``last_words``: sent unasked, as the process aborts or ends after its last job."""
    job_id: int | None
    text: str
    last_words: bool = False
