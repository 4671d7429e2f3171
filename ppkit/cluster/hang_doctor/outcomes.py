"""How each rank's job ended, in the doctor's words, and whether a rank's error came from a collective.

The doctor reads these with the records: a rank that finished or raised is not "still computing", and
a rank whose collective failed has its newest call counted as not completed (gloo retires a failed
call as if it completed).
"""

from __future__ import annotations

# a backend's error (c10d's DistBackendError) and gloo's transport's words when a peer is gone: a failed
# collective wherever Python saw it raised (DDP's reducer raises it from autograd, with no torch/distributed
# frame; torch 2.14's gloo raises it as a RuntimeError). Not the store's errors (DistStoreError, DistNetworkError):
# a store's get or wait is no collective.
BACKEND_ERRORS = ("DistBackendError",)
BACKEND_WORDS = ("gloo/transport/", "Connection closed by peer")


def failed_in_a_collective(error) -> bool:
    """``error``: a rank's ErrorInfo. Its traceback passes through torch/distributed/, or it is c10d's or gloo's."""
    return ("torch/distributed/" in error.traceback.replace("\\", "/") or error.type in BACKEND_ERRORS
            or any(words in error.message for words in BACKEND_WORDS))


def of_results(results: dict, last: bool, finished: str = "it finished its job", raised: str = "it raised"
               ) -> tuple[dict[int, str], set[int]]:
    """``results``: rank -> its Result (or Cancelled) of one job. How each rank that answered ended, and the
    ranks whose error came from a collective. ``last``: each rank's process ended with the job."""
    ended, failed = {}, set()
    for rank, result in results.items():
        if not hasattr(result, "ok"):  # Cancelled: no outcome of its own
            continue
        if result.ok:
            ended[rank] = finished + (" and its process ended" if last else "")
        else:
            ended[rank] = f"{raised} {result.value.type}"
            if failed_in_a_collective(result.value):
                failed.add(rank)
    return ended, failed


def last_job(results: dict) -> tuple[dict[int, str], set[int]]:
    """The same, on demand after a job of a cluster whose ranks stay (their processes wait for the next)."""
    return of_results(results, False, "its last job finished", "its last job raised")
