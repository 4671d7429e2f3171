"""``--max-restarts N``: when a rank fails, every rank stops and the whole group starts again, up to N times,
as torchrun's elastic agent does.

Each attempt is a run of its own: fresh processes, TORCHELASTIC_RESTART_COUNT = 0, 1, ..., and a new
rendezvous, a store that attempt's rank 0 hosts on a port of its own (a free one, or --master-port again),
so nothing the last attempt wrote in its store can be read by the next. torchrun 2.14.1 keeps one store, its
agent's, for every attempt; a restarted rank may then read the last attempt's gloo addresses and fail in
connectFullMesh ("Connection refused"), unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (docs/faults.md).

What ends a run at once, with no restart: Kernel > Interrupt, ppkit's own ``--timeout`` (a hang is not a
failure torchrun's agent sees, so it never restarts one), an error in what was asked (ConfigError).
"""

from __future__ import annotations

from collections.abc import Callable

from ppkit.errors import (
    DebuggerQuit,
    JobInterrupted,
    JobTimeoutError,
    ProcessExitedError,
    ProcessRaisedError,
    WorkerError,
)


def run(max_restarts: int, attempt: Callable[[int], object], name: str, say=print):
    """``attempt(restart_count)`` until one succeeds or ``max_restarts`` restarts have failed too; its value,
    or the last attempt's error with the earlier ones' causes as notes. ``say`` shows each restart."""
    __tracebackhide__ = True  # noqa: F841 - read by IPython's traceback
    causes: list[str] = []
    for count in range(max_restarts + 1):
        try:
            return attempt(count)
        except (JobTimeoutError, DebuggerQuit):
            raise  # a hang (torchrun's agent would wait for ever: ppkit's --timeout ends the run), or pdb's quit
        except WorkerError as exc:
            causes.append(cause(exc))
            if count == max_restarts:
                _final(exc, causes, max_restarts, name)
                raise
            _between(say, f"[ppkit] attempt {count} of {max_restarts + 1} failed: {causes[-1]}. Every rank was "
                          f"stopped; restart {count + 1} of {max_restarts} starts them all again, with a new "
                          f"rendezvous (TORCHELASTIC_RESTART_COUNT={count + 1}).", name)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _between(say, text: str, name: str) -> None:
    """Say a restart; Kernel > Interrupt here (no rank running) ends the run as it would during an attempt."""
    try:
        say(text, flush=True)
        return
    except KeyboardInterrupt:
        pass  # raised below, outside the handler: the cell shows JobInterrupted, not ppkit's frames
    raise JobInterrupted(f"interrupted between two attempts, while no rank was running: the run ends, with no "
                         f"restart. The next {name} starts fresh ranks.") from None


def cause(exc: WorkerError) -> str:
    """One line: which rank failed and how (exit code or signal, or its exception's last line)."""
    if isinstance(exc, ProcessExitedError):
        how = f"signal {exc.signal_name}" if exc.signal_name else f"exit code {exc.exit_code}"
        return f"rank {exc.error_index} (pid {exc.pid}) ended with {how}"
    if isinstance(exc, ProcessRaisedError):
        rank = exc.error_index
        last = exc.messages.get(rank, "").strip().splitlines()
        return f"rank {rank} (pid {exc.pid}) raised {exc.exc_types.get(rank)}" + (f": {last[-1]}" if last else "")
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {first}"


def _final(exc: WorkerError, causes: list[str], max_restarts: int, name: str) -> None:
    if max_restarts == 0:
        return  # a run without restarts says what it always said
    earlier = "; ".join(f"attempt {i}: {text}" for i, text in enumerate(causes[:-1]))
    exc.add_note(f"{name} ran {max_restarts + 1} attempts (--max-restarts {max_restarts}) and each failed; "
                 f"this is the last one's error. Earlier: {earlier}. A failure that repeats at each attempt is "
                 "in the script, not a transient fault: fix it, or resume from a checkpoint (docs/faults.md).")
    exc.restarts = max_restarts
    exc.attempt_causes = list(causes)
