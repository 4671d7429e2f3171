"""While ppkit's profiler records a rank, a second torch profiler started there is refused by name.

kineto holds one trace per process. A learner's own ``torch.profiler.profile`` started inside ppkit's
cancels ppkit's trace request (kineto prints "Cancelling current trace request...") and the rank then dies
of SIGSEGV (torch 2.14, ``ppkit.spawn(..., profile=True)``: 3 runs of 3). Every torch profiler starts
through ``torch.autograd.profiler.profile._prepare_trace``: ``torch.profiler.profile``'s start (or its
schedule's warmup) and the older ``torch.autograd.profiler.profile``. While ppkit records, that step raises
``ConfigError`` instead, in the learner's code, where the fix is."""

from __future__ import annotations

import functools

from ppkit.errors import ConfigError

_held: list[bool] = []  # True while ppkit's profiler records in this process
_original: list = []  # torch's _prepare_trace while it is wrapped


def hold() -> None:
    """ppkit's profiler has started here: refuse any other from now until ``release``."""
    from torch.autograd import profiler

    if not _original:
        _original.append(profiler.profile._prepare_trace)
        profiler.profile._prepare_trace = _refusing(_original[0])
    _held.append(True)


def release() -> None:
    """ppkit's profiler is about to stop: other profilers may start again."""
    from torch.autograd import profiler

    _held.clear()
    if _original:
        profiler.profile._prepare_trace = _original.pop()


def _refusing(prepare):
    @functools.wraps(prepare)
    def prepare_trace(self, *args, **kwargs):
        if _held:
            raise ConfigError(
                "ppkit's profiler already records this rank (profile=True, --profile or cluster.profile()), and "
                "torch keeps one profiler per process: a torch.profiler.profile started inside it crashes the "
                "rank (SIGSEGV in kineto). Either drop profile=True / --profile and keep your own profiler, or "
                "drop your own and read ppkit's: the Profile it returns holds each rank's events "
                "(prof.ranks[r].key_averages().table()).")
        return prepare(self, *args, **kwargs)

    return prepare_trace
