"""What a fault is: which rank fails, how (kill with a signal, raise, hang), and when (at once, at a step of
the loop that calls ``ppkit.step(i)``, or some seconds into the run). Checked here, in the kernel, before
any rank reads it."""

from __future__ import annotations

import math
import signal as signals
from dataclasses import dataclass, replace

from ppkit.errors import ConfigError

KINDS = ("kill", "raise", "hang")


@dataclass(frozen=True)
class Fault:
    """One fault, as ``ppkit.fail_rank`` was asked for it."""

    rank: int
    how: str = "kill"
    signal: int = signals.SIGKILL  # for "kill" only
    at_step: int | None = None  # None: when the run starts on that rank (or ``after`` seconds into it)
    after: float | None = None  # "kill" only: seconds after the run starts on that rank
    now: bool = False  # a kill sent from the kernel while the run went on (arming._kill_now)

    @property
    def signal_name(self) -> str:
        return signals.Signals(self.signal).name

    def describe(self) -> str:
        """As the learner would write it: ``ppkit.fail_rank(1, how='kill', signal='SIGTERM', at_step=3)``."""
        parts = [str(self.rank), f"how={self.how!r}"]
        if self.how == "kill":
            parts.append(f"signal={self.signal_name!r}")
        if self.at_step is not None:
            parts.append(f"at_step={self.at_step}")
        if self.after is not None:
            parts.append(f"after={self.after:g}")
        return f"ppkit.fail_rank({', '.join(parts)})"

    def when(self) -> str:
        if self.now:
            return "killed from the kernel while the run went on"
        if self.at_step is not None:
            return f"at ppkit.step({self.at_step})"
        if self.after is not None:
            return f"{self.after:g} s into the run"
        return "as soon as the run starts on it"


def sent_now(planned: Fault) -> Fault:
    return replace(planned, now=True)


def fault(rank, how: str, signal, at_step, after) -> Fault:
    """A checked ``Fault``: every wrong argument says what to write instead."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError(f"ppkit.fail_rank needs the rank to fail, a whole number from 0, got {rank!r}: "
                          "ppkit.fail_rank(1).")
    if how not in KINDS:
        raise ConfigError(f"how={how!r}: a rank can be failed by 'kill' (a signal, SIGKILL by default), 'raise' "
                          "(an exception at a step) or 'hang' (it stops at a step and never returns).")
    if signal is not None and how != "kill":
        raise ConfigError(f"signal={signal!r} goes with how='kill' only: a rank that is made to {how} is not "
                          "sent a signal. Leave signal out, or write how='kill'.")
    if at_step is not None and (isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0):
        raise ConfigError(f"at_step={at_step!r}: give the step, a whole number from 0, at which the rank fails; "
                          "the rank's loop says which step it is at with ppkit.step(i).")
    if after is not None:
        if how != "kill":
            raise ConfigError(f"after={after!r} goes with how='kill' only: a rank can be made to {how} only at a "
                              "point of its own code. Give at_step=N, and call ppkit.step(i) in the loop.")
        if at_step is not None:
            raise ConfigError("give at_step or after, not both: at a step of the loop, or some seconds into the run.")
        if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after < math.inf:
            raise ConfigError(f"after={after!r}: give the seconds into the run at which the rank is killed, "
                              "0 or more, e.g. after=2.")
    return Fault(rank, how, _signal(signal), at_step, None if after is None else float(after))


def _signal(value) -> int:
    if value is None:
        return signals.SIGKILL
    if isinstance(value, str):
        name = value.upper()
        name = name if name.startswith("SIG") else "SIG" + name
        if name in signals.Signals.__members__:
            return signals.Signals[name].value
    elif isinstance(value, int) and not isinstance(value, bool) and value in signals.Signals._value2member_map_:
        return int(value)
    raise ConfigError(f"signal={value!r} is not a signal of this system; give one by name or number, e.g. "
                      "signal='SIGTERM' (what a scheduler sends first) or signal.SIGKILL (the default).")
