"""A run without a time limit still says when it hangs: once, with where each rank waits, and runs on.

``ppkit.spawn`` and ``%%torchrun`` have no wall-clock limit by default, as mp.spawn and torchrun have
none: a training run takes as long as it takes. A hang is told apart from a long step by two signs
together: for ``PPKIT_HANG_S`` seconds (default 60; 0 turns the watch off) no rank printed anything
or finished, and every rank that is still running waits on its peers: its stack ends inside
torch.distributed (a collective, a send/recv, a barrier, a store), or its flight record shows a
collective started and not completed while its main thread is not in its own code and uses no CPU
time (DDP's reducer waits inside autograd in C++, measured on gloo; by torch's design NCCL's waits at
``.item()`` or ``synchronize``, not measured here: no GPU). A rank in its own code, or computing in
torch.nn or autograd (its main thread's CPU time moves, as its record is read or between two looks),
with a gloo call pending is computing (an overlap: isend, compute, wait). And a second look,
``CONFIRM_S`` later, finds the ranks' records and stacks as they were: a loop of collectives is inside
torch.distributed at any look, but its record moves; a loop of a Linear's forward passes the same lines,
but its CPU time moves. Then the cell
shows the collective doctor's reading of the ranks' records (hang_doctor/) and each rank's stack once,
and the run goes on:
the learner decides (Kernel > Interrupt stops every rank). A rank that computes for a minute
without printing is not reported: its stack is in its own code, and the watch looks again later.
"""

from __future__ import annotations

import os
import re
import time

HANG_ENV = "PPKIT_HANG_S"
DEFAULT_HANG_S = 60.0
CONFIRM_S = 3.0  # the second look, after a first that found every rank waiting (at most the watch's own time)
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+, in (?P<func>\S+)', re.MULTILINE)
WAITS = ("torch/distributed/", "torch\\distributed\\")


def threshold() -> float:
    """Seconds of silence before a look at the stacks, from ``PPKIT_HANG_S``; 0: no watch."""
    text = os.environ.get(HANG_ENV, "")
    try:
        value = float(text) if text else DEFAULT_HANG_S
    except ValueError:
        value = DEFAULT_HANG_S
    return value if value > 0 else 0.0


def waits_on_peers(stack: str) -> bool:
    """Whether a rank's stack ends inside torch.distributed, where a rank waits for the others."""
    frames = _FRAME.findall(stack)
    return bool(frames) and any(part in frames[-1][0] for part in WAITS)


class HangWatch:
    """Armed for one run; ``due(last_activity)`` says when to look, ``look(stacks)`` whether to tell."""

    def __init__(self, seconds: float, show_stacks=None):
        self.seconds = seconds
        self.told = False
        self._show = show_stacks or _cells_named  # the caller's view of a stack (its own frames left out)
        self._since = time.monotonic()  # the last look that found ranks busy, or the run's start
        self._last_activity = self._since
        self._moved = self._since  # the last look that found a rank busy or a record moved: the silence's start
        self._seen = None  # what the last look found, where every rank waited: the next must find the same
        self._records: dict[int, dict] = {}  # the last look's records: a rank whose CPU time moved since computed

    def due(self, last_activity: float) -> float:
        """When to look next: ``seconds`` after the latest of the run's output, results and looks."""
        self._last_activity = last_activity
        if self.told or not self.seconds:
            return float("inf")
        if self._seen is not None and last_activity <= self._since:  # confirm a look that found every rank waiting
            return self._since + min(self.seconds, CONFIRM_S)
        self._seen = None  # output since: the silence starts again
        return max(last_activity, self._since) + self.seconds

    def look(self, stacks: dict[int, str], records: dict[int, dict] | None = None, diagnosis=None) -> str | None:
        """The message to print once if every waiting rank waits on its peers (by its stack or its
        flight record, ``records``) at two looks in a row, with nothing moved in between, else None
        (look again later). ``diagnosis``: the collective doctor's (hang_doctor.diagnose), shown
        before the stacks."""
        from ppkit.cluster import hang_doctor

        records = records or {}
        now = time.monotonic()
        quiet, self._since = now - max(self._last_activity, self._moved), now
        before, self._records = self._records, records
        if not stacks or not all(_waits(text, records.get(rank), before.get(rank)) for rank, text in stacks.items()):
            self._seen, self._moved = None, now
            return None
        seen = {rank: (text, hang_doctor.progress(records.get(rank))) for rank, text in stacks.items()}
        if seen != self._seen:  # the first look, or the record moved since: look once more
            self._moved = now if self._seen is not None else self._moved
            self._seen = seen
            return None
        self.told = True
        _record(quiet, stacks)
        shown = "".join(f"\n--- rank {r} waits here ---\n{text}" for r, text in self._show(stacks).items())
        return (f"[ppkit] possibly hung: for {self.seconds:g} s no rank printed or finished, and rank(s) "
                f"{sorted(stacks)} each wait inside torch.distributed or on a collective they started (a collective, "
                "send/recv or barrier that another rank has not reached). The run goes on; Kernel > Interrupt "
                "stops every rank. "
                f"(This look comes once per run, after {HANG_ENV}={self.seconds:g} s of silence.)\n"
                + (str(diagnosis) if diagnosis is not None else "") + shown + "\n")


def _cells_named(stacks: dict[int, str]) -> dict[int, str]:
    from ppkit.cluster.diagnostics import cells_named

    return {rank: cells_named(text) for rank, text in stacks.items()}


def _waits(stack: str, record: dict | None, earlier: dict | None) -> bool:
    """A rank waits on its peers by its stack, or by its flight record unless its main thread used CPU time
    since the last look's record (``earlier``): a loop of a Linear's forward looks the same at each look."""
    from ppkit.cluster import hang_doctor
    from ppkit.cluster.hang_doctor.gather import computed_between

    return waits_on_peers(stack) or (hang_doctor.waits_on_peers(record) and not computed_between(earlier, record))


def _record(quiet: float, stacks: dict[int, str]) -> None:
    """The learner's progress record says the run hung, and where each rank waits (ppkit/progress/)."""
    from ppkit.progress import note

    waits = ", ".join(f"rank {r} in {(_FRAME.findall(text) or [('', '?')])[-1][1]}"
                      for r, text in sorted(stacks.items()))
    note("cluster", state="hung", seconds=round(quiet, 1),
         detail=f"every rank waits on its peers (stack or flight record): {waits}")
