"""How each rank's job ended, in the doctor's words, and whether a rank's error came from a collective.

The doctor reads these with the records: a rank that finished or raised is not "still computing", and
a rank whose collective failed has its newest call counted as not completed (gloo retires a failed
call as if it completed).
"""

from __future__ import annotations

import re

# a backend's error (c10d's DistBackendError) is a failed collective wherever Python saw it raised. gloo's transport
# errors (a peer gone: "Connection closed by peer") come as a RuntimeError whose message starts with gloo's C++
# source line, raised from torch's own code (DDP's reducer raises it from autograd, with no torch/distributed
# frame). The words alone are not one: a learner's own OSError may say "Connection closed by peer". Not the store's
# errors either (DistStoreError, DistNetworkError): a store's get or wait is no collective.
BACKEND_ERRORS = ("DistBackendError",)
GLOO_SAYS = re.compile(r"^\[[^\]]*gloo/[^\]]*:\d+\]")  # "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561]"
OWN_WRAPPER = "ppkit/transport/flight_calls.py"  # wraps Work.wait: a failed wait raises in it
_FILE = re.compile(r'^\s*File "([^"]+)"', re.MULTILINE)


def failed_in_a_collective(error) -> bool:
    """``error``: a rank's ErrorInfo. Raised in torch.distributed, or c10d's error, or gloo's raised by torch."""
    files = [name.replace("\\", "/") for name in _FILE.findall(error.traceback)]
    files = [name for name in files if not name.endswith(OWN_WRAPPER)]
    raised_in = files[-1] if files else ""  # the innermost frame: where Python saw it raised
    return ("torch/distributed/" in raised_in or error.type in BACKEND_ERRORS
            or error.type == "RuntimeError" and "/torch/" in raised_in and bool(GLOO_SAYS.match(error.message)))


# how a rank's job ended without raising, in the words of_results and jobs.py give it
CLEAN_ENDS = ("it finished its job", "its last job finished", "it exited through sys.exit (status 0)",
              "its process exited with status 0")


def ended_cleanly(how: str) -> bool:
    """``how`` (an ``ended`` value) says the rank's job returned (or exited with status 0): it did not raise."""
    return how.startswith(CLEAN_ENDS)


SYS_EXIT = "ppkit: fn ended through sys.exit with status 0"  # what a rank's last job returns then (one_call.py)


def _exited(result) -> bool:
    from ppkit.transport import byvalue

    return result.value == byvalue.dumps(SYS_EXIT)


def of_results(results: dict, last: bool, finished: str = "it finished its job", raised: str = "it raised"
               ) -> tuple[dict[int, str], set[int]]:
    """``results``: rank -> its Result (or Cancelled) of one job. How each rank that answered ended, and the
    ranks whose error came from a collective. ``last``: each rank's process ended with the job."""
    ended, failed = {}, set()
    for rank, result in results.items():
        if not hasattr(result, "ok"):  # Cancelled: no outcome of its own
            continue
        if result.ok:
            how = "it exited through sys.exit (status 0)" if last and _exited(result) else finished
            ended[rank] = how + (" and its process ended" if last else "")
        else:
            ended[rank] = f"{raised} {result.value.type}"
            if failed_in_a_collective(result.value):
                failed.add(rank)
    return ended, failed


def last_job(results: dict) -> tuple[dict[int, str], set[int]]:
    """The same, on demand after a job of a cluster whose ranks stay (their processes wait for the next)."""
    return of_results(results, False, "its last job finished", "its last job raised")
