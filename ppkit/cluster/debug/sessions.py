"""The notebook's side of pdb on ranks: each prompt a rank sends is asked through the kernel's stdin.

``input()`` in the kernel is an input box under the running cell in JupyterLab and a prompt in a
terminal's IPython. One rank at a time is *active*: its prompts are answered until it continues,
quits or ends its job; prompts of other ranks wait their turn, and each prompt says who waits.
The time spent waiting for the learner is counted (``paused_s``) so that the job's timeout can
leave it out. A quit, Kernel > Interrupt at a prompt, or a front end that cannot answer (nbval,
``nbconvert --execute``) ends the sessions: ``ended`` then says why, and the caller stops the job.
"""

from __future__ import annotations

import builtins
import time
from dataclasses import dataclass

from ppkit.cluster.inbox import Closed
from ppkit.errors import DebuggerQuit, JobInterrupted
from ppkit.transport.debug.messages import DebugLeft, DebugLine, DebugPrompt
from ppkit.transport.messages import Cancelled, Result

SWITCH_AFTER_S = 1.5  # an active rank silent this long after a command, with others waiting: theirs now


@dataclass(frozen=True)
class Ended:
    """Why the sessions ended early: ``how`` is "quit", "interrupted" or "no stdin", on ``rank``,
    stopped at ``where``."""
    rank: int
    how: str
    where: str


class Sessions:
    """The pdb sessions of one job (or one post-mortem). ``send(rank, msg)`` reaches a rank; ``flush(rank)``
    prints what ranks wrote so far (RankPrinter.interject: ``rank``'s half line ended, the others' kept);
    ``ask(prompt)`` reads the learner's line (default: ``input``, looked up when asking: ipykernel puts its own in
    ``builtins`` for each cell)."""

    def __init__(self, send, flush, ask=None, world_size: int = 0):
        self._send, self._flush = send, flush
        self._ask = ask or (lambda prompt: builtins.input(prompt))
        self.world_size = world_size
        self.active: int | None = None  # the rank whose prompts the learner answers now
        self._where: dict[int, str] = {}  # rank in pdb (active, waiting or busy) -> where it stopped
        self.waiting: dict[int, DebugPrompt] = {}  # rank -> its first prompt, not asked yet
        self.paused_s = 0.0  # time spent waiting for the learner
        self.ended: Ended | None = None
        self._answered_at = 0.0

    def take(self, source, msg) -> bool:
        """Deal with ``msg`` from ``source`` if it is a pdb message (True); a result from the
        active rank ends its session (False: the caller takes the result)."""
        if isinstance(msg, DebugPrompt):
            if self.active not in (None, source):
                self.waiting[source] = msg
            else:
                self._answer(source, msg)
            return True
        if isinstance(msg, DebugLeft):
            self._print(msg.text)
            where = self._where.pop(source, "(unknown)")
            if msg.quit and self.ended is None:
                self.ended = Ended(source, "quit", where)
            if source == self.active:
                self._next()
            return True
        if source == self.active and isinstance(msg, (Result, Cancelled, Closed)):  # its job ended as it stepped
            self._where.pop(source, None)
            self._next()
        return False

    def switch_at(self) -> float | None:
        """When to give up waiting for the active rank's next prompt: it may be blocked in a
        collective, waiting for a rank that waits at a prompt of its own (None: never)."""
        if self.active is None or not self.waiting or self.ended:
            return None
        return self._answered_at + SWITCH_AFTER_S

    def switch(self) -> None:
        """The active rank is busy (blocked): ask the next waiting rank meanwhile."""
        busy = self.active
        self._flush(None)
        print(f"[ppkit] rank {busy} is busy (probably in a collective, waiting for a rank stopped at a "
              f"breakpoint): over to rank {min(self.waiting)}; rank {busy}'s next prompt comes after.")
        self._next()

    def _next(self) -> None:
        self.active = None
        while self.waiting and self.ended is None and self.active is None:
            rank = min(self.waiting)
            self._answer(rank, self.waiting.pop(rank))

    def _answer(self, rank: int, prompt: DebugPrompt) -> None:
        self._flush(rank)
        if self.active is None:
            self.active = rank
            others = [r for r in range(self.world_size) if r != rank and r not in self.waiting and r not in self._where]
            print(f"[ppkit] rank {rank} stopped at {prompt.where}. pdb commands now go to rank {rank} "
                  "(n, s, c, p x, l, q)."
                  + (f" Rank(s) {others} run on until they wait for it, in their next collective." if others else ""))
        self._where[rank] = prompt.where
        self._print(prompt.text)
        label = prompt.prompt.rstrip()
        if self.waiting:
            label += f" [also at a breakpoint: rank(s) {sorted(self.waiting)}]"
        start = time.monotonic()
        try:
            line = self._ask(label + " ")
        except KeyboardInterrupt:
            self.ended = Ended(rank, "interrupted", prompt.where)
            return
        except (EOFError, NotImplementedError):  # IPython's StdinNotImplementedError: no stdin here
            self.ended = Ended(rank, "no stdin", prompt.where)
            return
        finally:
            self.paused_s += time.monotonic() - start
        self._answered_at = time.monotonic()
        self._send(rank, DebugLine(line))

    @staticmethod
    def _print(text: str) -> None:
        if text:
            print(text, end="" if text.endswith("\n") else "\n", flush=True)


def ended_error(ended: Ended, stuck: list[int], restarted: bool) -> DebuggerQuit | JobInterrupted:
    """The error of a job that a pdb session ended; ``stuck``: ranks that did not stop when
    cancelled, ``restarted``: ppkit restarted every rank for them."""
    if restarted:
        after = (f" Rank(s) {stuck} were blocked in a collective, waiting for rank {ended.rank}, so ppkit restarted "
                 "every rank (a new process group; what %%ranks cells defined on the ranks is gone). The cluster "
                 "is ready: run the cell again.")
    elif stuck:
        after = f" Rank(s) {stuck} are still blocked: cluster.restart() starts clean ranks."
    else:
        after = " The cluster is ready: run the cell again."
    if ended.how == "interrupted":
        return JobInterrupted(f"interrupted during the pdb session on rank {ended.rank}: the job stopped on every "
                              f"rank.{after}", stuck, {})
    if ended.how == "no stdin":
        text = (f"rank {ended.rank} stopped at a breakpoint ({ended.where}), but nothing here can answer pdb's "
                "prompt: this front end does not allow input (nbval, jupyter nbconvert --execute, ...). Remove the "
                "breakpoint, or skip every breakpoint on the ranks with PYTHONBREAKPOINT=0 "
                "(ppkit.start(..., env={'PYTHONBREAKPOINT': '0'})). The job stopped on every rank." + after)
    else:
        text = f"you quit pdb on rank {ended.rank} ({ended.where}): the job stopped on every rank." + after
    return DebuggerQuit(text, ended.rank, ended.how, ended.where, restarted)
