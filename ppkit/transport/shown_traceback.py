"""A rank's traceback and stack as the learner should read them: without the frames of ppkit's own
that run their code or wrap torch's calls.

Frames are removed from each stack of the exception's tree (its cause, its context, an ExceptionGroup's
members), not from the formatted text by line, so a chained cause and a group's members stay whole.
"""

from __future__ import annotations

import traceback

# the frames of ppkit's own that run the learner's code in a process: a stack starts after the last of them
# (the worker's job loop, a %%ranks cell's exec, ppkit.spawn's and %%torchrun's call; _run_code: runpy's, for -m;
# with_fault: a job that carries ppkit.fail_rank's fault, cluster/faults/on_rank.py)
RUNNERS = ("_run_job", "exec_cell", "_call_rank", "run_as_rank", "_run_target", "_run_code", "with_fault")
# the recorder's wrapper of Work.wait (flight_calls.py): in every stack that waits in a collective
WRAPPERS = ("ppkit/transport/flight_calls.py",)


def learners(frames: list) -> list:
    """``frames`` (FrameSummary, outermost first) from the learner's code on, without ppkit's wrappers."""
    runners = [i for i, frame in enumerate(frames) if frame.name in RUNNERS]
    if runners and runners[-1] + 1 < len(frames):  # raised in the runner itself: keep it all, it is the story
        frames = frames[runners[-1] + 1:]
    return [frame for frame in frames if not frame.filename.replace("\\", "/").endswith(WRAPPERS)]


def exception_text(exc: BaseException, tb) -> str:
    """``exc`` formatted as Python does (from ``tb`` on), each of its stacks trimmed by ``learners``."""
    shown = traceback.TracebackException(type(exc), exc, tb, compact=True)
    _trim(shown, set())
    return "".join(shown.format())


def stack_text(frame) -> str:
    """The stack of ``frame`` (a thread's current frame), formatted as traceback.format_stack does."""
    frames = learners(list(traceback.extract_stack(frame)))
    return "".join(traceback.StackSummary.from_list(frames).format())


def _trim(shown: traceback.TracebackException, seen: set) -> None:
    if id(shown) in seen:
        return
    seen.add(id(shown))
    shown.stack = traceback.StackSummary.from_list(learners(list(shown.stack)))
    for linked in (shown.__cause__, shown.__context__, *(getattr(shown, "exceptions", None) or ())):
        if linked is not None:
            _trim(linked, seen)
