"""What ``ppkit.spawn`` says when a call fails.

The call runs on a hidden cluster, whose own errors would tell the learner to run
``cluster.restart()``, a cluster they never made. These say the same things for a learner who
called ``mp.spawn``: which process (its rank and pid) failed and how, where the others waited, and
that every process of the call is already gone.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from ppkit.cluster.diagnostics import cells_named, describe_status, format_stacks, reinit_note
from ppkit.errors import (
    ConfigError,
    JobInterrupted,
    JobTimeoutError,
    ProcessExitedError,
    ProcessRaisedError,
    RemoteError,
    WorkerDiedError,
    WorkerError,
)
from ppkit.transport import byvalue, interpreter_exit, shown_traceback

STOPPED = "Every process of this call has been stopped. The next ppkit.spawn starts fresh ones."
# the frames of ppkit's own that run the learner's code in a process: a stack starts after them (the ranks trim
# their tracebacks and stacks so already: transport/shown_traceback.py)
OWN_FRAMES = tuple(f", in {name}" for name in shown_traceback.RUNNERS)


@dataclass(frozen=True)
class Caller:
    """Who called, in the words of the messages: ppkit.spawn's processes, or %%torchrun's ranks."""

    name: str = "ppkit.spawn"
    unit: str = "process"
    timeout_hint: str = "Pass ppkit.spawn(..., timeout=SECONDS)"
    work: str = "fn"  # what ran: "fn returned", "the script returned"
    mimics: str = "mp.spawn"

    @property
    def units(self) -> str:
        """The plural: processes, ranks."""
        return self.unit + ("es" if self.unit.endswith("s") else "s")

    @property
    def some(self) -> str:
        """One or more: process(es), rank(s)."""
        return self.unit + ("(es)" if self.unit.endswith("s") else "(s)")

    kept: int | None = None  # the rank kept for %debug (parked.py), if one is

    @property
    def stopped(self) -> str:
        if self.kept is not None:
            return (f"The other processes of this call have been stopped; {self.unit} {self.kept} stays until the "
                    f"end of the next cell, for %debug there (pdb in its frame). The next {self.name} starts fresh "
                    "ones.")
        return f"Every process of this call has been stopped. The next {self.name} starts fresh ones."


SPAWN = Caller()


def translate(exc: BaseException, pids: dict[int, int], nprocs: int, timeout: float | None,
              caller: Caller = SPAWN) -> BaseException:
    """The hidden cluster's error ``exc`` as ppkit.spawn's own (``exc`` itself if it has none), with the
    collective doctor's reading of the records (``diagnosis``) that ``exc`` carries."""
    error = _translated(exc, pids, nprocs, timeout, caller)
    if isinstance(error, (WorkerError, JobInterrupted)) and getattr(exc, "diagnosis", None) is not None:
        error.diagnosis = exc.diagnosis
    return error


def _translated(exc: BaseException, pids: dict[int, int], nprocs: int, timeout: float | None,
                caller: Caller) -> BaseException:
    if isinstance(exc, RemoteError):
        return raised(exc, pids, nprocs, caller)
    if isinstance(exc, WorkerDiedError) and exc.ranks:
        return exited(exc.ranks[0], pids, nprocs, exc.status, exc.how, caller)
    if isinstance(exc, JobTimeoutError) and timeout is not None:  # without a limit: the job was not even taken
        return timed_out(exc, timeout, caller)
    if isinstance(exc, JobInterrupted):
        return interrupted(exc, caller)
    return exc


def from_fn(text: str) -> str:
    """A stack or traceback from the call of ``fn`` on: the frames of the worker that ran it (its
    job loop, ``_call_rank``) say nothing to a learner who called mp.spawn. A notebook cell's frame is
    named as IPython and the collective doctor name it (``Cell In[4], line 5``), not by the kernel's file."""
    return cells_named(_after_runners(text))


def _after_runners(text: str) -> str:
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    ours = [i for i in starts if lines[i].rstrip().endswith(OWN_FRAMES)]
    if not ours:
        return text
    after = [i for i in starts if i > ours[-1]]
    head = lines[:1] if lines and lines[0].startswith("Traceback") else []
    return "".join(head + lines[after[0]:]) if after else text


def shown_stacks(stacks: dict) -> dict:
    """Each rank's stack from the learner's function on (the hang watch's view)."""
    return {rank: from_fn(text) for rank, text in stacks.items()}


def _stacks(stacks: dict) -> str:
    return format_stacks({rank: from_fn(text) for rank, text in stacks.items()})


def _who(rank: int, pids: dict[int, int], nprocs: int, caller: Caller = SPAWN) -> str:
    return f"{caller.unit} {rank} of {nprocs} (pid {pids.get(rank)})"


def _reinit(rendezvous: dict) -> str:
    note = reinit_note(rendezvous, "Call init_process_group once per process, or give the second group another port.")
    return f" {note.rstrip()}" if note else ""


def raised(exc: RemoteError, pids: dict[int, int], nprocs: int, caller: Caller = SPAWN) -> BaseException:
    failed = exc.ranks
    first = failed[0]
    if all(exc.exc_types.get(r) == "SystemExit" for r in failed):  # sys.exit(code), code not 0
        message = exc.messages.get(first, "")
        number = message.lstrip("-").isdigit()
        code = int(message) if number else 1  # sys.exit("text") prints it and exits with 1
        return ProcessExitedError(
            f"{_who(first, pids, nprocs, caller)} called sys.exit({message if number else repr(message)}) before "
            f"{caller.work} returned: exit code {code}, which {caller.mimics} reports as a failure too. "
            f"{caller.stopped}\n\n--- traceback in {caller.unit} {first} ---\n"
            f"{from_fn(exc.tracebacks.get(first, ''))}", first, pids.get(first), exit_code=code)
    what = f"{exc.exc_types.get(first)}: {exc.messages.get(first, '')}"
    text = (f"{_who(first, pids, nprocs, caller)} raised {what}" if len(failed) == 1 else
            f"processes {failed} raised an exception ({_who(first, pids, nprocs, caller)}: {what})")
    text += f". {caller.stopped}"
    waiting = sorted(exc.stacks)
    if waiting:
        text += (f" {caller.some.capitalize()} {waiting} were still running, probably waiting for {caller.unit} "
                 f"{first}: where each waited is at the end.")
    text += _reinit(exc.rendezvous)
    for r in failed:
        text += f"\n\n--- traceback in {caller.unit} {r} ---\n{from_fn(exc.tracebacks.get(r, ''))}"
    if waiting:
        text += "\n" + _stacks(exc.stacks)
    return ProcessRaisedError(text, exc, first, pids.get(first))


def exited(rank: int, pids: dict[int, int], nprocs: int, status: int | None, how: str = "",
           caller: Caller = SPAWN) -> ProcessExitedError:
    """``how``: the launcher's words for the end, where it knew more than ``status`` (an out-of-memory kill)."""
    code = sig = None
    if status is not None and os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        sig = signal.Signals(number).name if number in signal.Signals._value2member_map_ else str(number)
    elif status is not None:
        code = os.WEXITSTATUS(status)
    hint = {"SIGKILL": " (the out-of-memory killer sends SIGKILL: is the machine short of memory?)",
            "SIGSEGV": " (a crash in C or C++ code: its output above may say where)"}.get(sig, "")
    if code is not None:
        hint = " (os._exit, or a library that exits the process: its output above may say why)"
    if sig == "SIGKILL" and "out-of-memory killer" in how:  # the cgroup said whether it was
        hint = ""
    return ProcessExitedError(
        f"{_who(rank, pids, nprocs, caller)} ended before {caller.work} returned: "
        f"{how or describe_status(status)}{hint}. The other {caller.units} may have been waiting for it. "
        f"{caller.stopped}", rank, pids.get(rank), code, sig, status)


def _exiting(stacks: dict) -> list[int]:
    """The ranks whose fn returned and whose exit waits for a non-daemon thread (interpreter_exit.waiting_for)."""
    return sorted(r for r, text in stacks.items() if text.startswith(interpreter_exit.RETURNED))


def _exit_waits(ranks: list[int], caller: Caller) -> str:
    return (f" {caller.some.capitalize()} {ranks} had returned and their exit waits for a non-daemon thread, as a "
            "script's would (named below).") if ranks else ""


def timed_out(exc: JobTimeoutError, timeout: float, caller: Caller = SPAWN) -> JobTimeoutError:
    mute = [r for r in exc.ranks if exc.stacks.get(r) == "(no answer)"]
    reinit, exiting = _reinit(exc.rendezvous), _exiting(exc.stacks)
    usual = _exit_waits(exiting, caller) + ("" if exiting and set(exiting) >= set(exc.ranks) else
                                            " Usually a send without a matching recv, or a collective that not "
                                            "every process called.")
    return JobTimeoutError(
        f"the {caller.units} did not finish within {timeout:g} s ({caller.name}'s timeout): {caller.some} "
        f"{exc.ranks} were still running" + (f" ({caller.some} {exc.done} had finished)" if exc.done else "")
        + (f"; {caller.some} {mute} did not even say where they wait: stopped, frozen or overloaded" if mute
           else "")
        + f". {caller.stopped}" + (reinit or usual)
        + f" {caller.timeout_hint} if the work is just slow. Where each {caller.unit} "
        "waited:\n" + _stacks(exc.stacks), exc.ranks, exc.stacks, exc.done, exc.rendezvous)


def interrupted(exc: JobInterrupted, caller: Caller = SPAWN) -> JobInterrupted:
    exiting = _exiting(exc.stacks)
    blocked = [r for r in exc.ranks if r not in exiting]
    stuck = f" ({caller.some} {blocked} were blocked outside Python, e.g. in a collective)" if blocked else ""
    where = (f" Where each {caller.unit} was:\n" + _stacks(exc.stacks)) if exc.stacks else ""
    return JobInterrupted(f"interrupted{stuck}.{_exit_waits(exiting, caller)} {caller.stopped}{where}", exc.ranks,
                          exc.stacks)


def cannot_send(fn, args: tuple, exc: ConfigError, caller: Caller = SPAWN) -> ConfigError:
    """``fn`` or one of ``args`` cannot be pickled: say which."""
    culprit, cause = "fn and its args", exc.__cause__ or exc
    for name, value in [(getattr(fn, "__name__", "fn"), fn), *((f"args[{i}]", a) for i, a in enumerate(args))]:
        try:
            byvalue.dumps(value)
        except Exception as err:  # noqa: BLE001 - any pickling failure names its culprit
            culprit, cause = f"{name} ({type(value).__name__})", err
            break
    return ConfigError(
        f"{caller.name} cannot send {culprit} to the new processes: {cause}. fn and args are pickled, "
        f"as {caller.mimics} pickles them (functions and classes from notebook cells by value). Pass data "
        "(tensors, numbers, lists, file paths) and create what cannot be pickled (locks, open files, "
        "process groups) inside fn. A multiprocessing queue or manager cannot reach these processes "
        "either (they are not children of this kernel): to get results back, write them to files, or "
        "use cluster.run, which returns them.")
