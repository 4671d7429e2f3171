"""The exercise that ppkit checks for notebook 10b: which DDP bucket's all-reduce starts first.

    check_first_bucket(fn)   fn(params, bucket_cap_mb) -> the names of the parameters in that bucket

``params`` is the model's ``(name, bytes)`` in ``named_parameters()`` order. The checker runs each model in
real DDP on 2 ranks, notes with a communication hook which parameters each bucket holds and in which order
DDP launched their all-reduces (from the second step on, after DDP rebuilt its buckets), and compares the
first with the answer. A wrong answer is named: the first layer's bucket (it goes last), every parameter at
once (notebook 03's all-reduce after backward), another real bucket, or a bucket that does not exist.
"""

from __future__ import annotations

from ppkit.checks import check_callable
from ppkit.errors import WorkerError
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.exercises.subworld import SubworldRunner
from ppkit.lessons import overlap

# (label, the MLP's widths, bucket_cap_mb): several buckets each, a cap crossed inside a layer, a small head
CASES = (
    ("4 layers of 64, bucket_cap_mb=0.02", (64, 64, 64, 64, 64), 0.02),
    ("64 -> 128 -> 128 -> 10, bucket_cap_mb=0.05", (64, 128, 128, 10), 0.05),
    ("3 layers of 96, bucket_cap_mb=0.01", (96, 96, 96, 96), 0.01),
)
TIMEOUT_S = 120
_MEASURED: dict = {}  # (widths, cap) -> buckets in launch order: the bucketing of a model and cap is fixed


def measured_buckets(widths, bucket_cap_mb, cluster=None) -> list[list[str]]:
    """DDP's buckets for ``make_mlp(widths)``, in the order their all-reduce started, measured on 2 ranks: of
    ``cluster`` when it has a process group (the notebook's), else in a fresh 2-rank group on it (or on a
    cluster of its own)."""
    key = (tuple(widths), bucket_cap_mb)
    if key in _MEASURED:
        return _MEASURED[key]
    if cluster is not None and cluster.process_group and cluster.world_size == 2:
        _MEASURED[key] = cluster.run(overlap.ddp_buckets, list(widths), bucket_cap_mb)[0]
        return _MEASURED[key]
    runner = SubworldRunner((2,), TIMEOUT_S, None if cluster is None or cluster.process_group else cluster)
    try:
        results, problem = runner.run(2, overlap.ddp_buckets, list(widths), bucket_cap_mb)
    finally:
        runner.close()
    if problem:
        raise WorkerError(f"the checker could not run DDP on 2 ranks to see its buckets: {problem}. Your answer "
                          "was not judged; run the check again, or ppkit.start(2) and pass cluster=.")
    _MEASURED[key] = results[0]
    return _MEASURED[key]


def _as_names(got):
    if isinstance(got, str) or not isinstance(got, (list, tuple, set, frozenset)):
        return None
    return list(got) if all(isinstance(n, str) for n in got) else None


def forward_fill_first(params, cap_bytes: int) -> list[str]:
    """The first bucket if DDP filled from the first parameter: the bucket that does not exist."""
    bucket, size = [], 0
    for name, nbytes in params:
        bucket.append(name)
        size += nbytes
        if size >= cap_bytes:
            break
    return bucket


def _shown(names) -> str:
    return "[" + ", ".join(names) + "]"


def mistake(got: list[str], buckets: list[list[str]], params, bucket_cap_mb) -> str | None:
    """What is wrong with ``got`` as the first bucket, or None when it is the first bucket."""
    names = [n for n, _ in params]
    unknown = [n for n in got if n not in names]
    if unknown:
        return (f"{_shown(unknown)} {'is' if len(unknown) == 1 else 'are'} not a parameter of this model; its "
                f"parameters are {_shown(names)}: return names from params")
    want, chosen = buckets[0], set(got)
    if chosen == set(want):
        return None
    order = "; ".join(f"{i + 1}. {_shown(b)}" for i, b in enumerate(buckets))
    if chosen == set(names):
        return ("that is every parameter at once: one all-reduce after backward, as notebook 03's hand-written DP "
                "does (and DDP's very first step, before it rebuilds its buckets). From the second step DDP "
                f"all-reduces bucket by bucket while backward still runs, and the first one is {_shown(want)}")
    hint = ("backward runs from the loss back to the input, so the last layer's gradients are ready first, and "
            "DDP fills its buckets in reverse parameter order")
    if chosen == set(buckets[-1]):
        return (f"that is the first layer's bucket, and its all-reduce starts last: {hint}. The order: {order}")
    for i, bucket in enumerate(buckets[1:], start=2):
        if chosen == set(bucket):
            return f"that bucket's all-reduce starts {_ordinal(i)}, not first. The order: {order}"
    cap = int(bucket_cap_mb * 1024 * 1024)
    if chosen == set(forward_fill_first(params, cap)):
        return (f"no DDP bucket holds exactly these: that is a bucket filled from the first parameter. {hint}. "
                f"The buckets, in the order their all-reduce starts: {order}")
    return (f"no DDP bucket holds exactly {_shown(got)}. A bucket closes once it reaches bucket_cap_mb "
            f"({cap:,} bytes), with the parameter that crosses it. The buckets, in the order their all-reduce "
            f"starts: {order}")


def _ordinal(i: int) -> str:
    return {2: "second", 3: "third", 4: "fourth"}.get(i, f"{i}th")


def check_first_bucket(fn, cluster=None) -> CheckReport:
    """Check ``fn(params, bucket_cap_mb)`` against the first bucket DDP launched, measured for each of CASES."""
    check_callable(fn, "fn(params, bucket_cap_mb)")
    report = CheckReport("the first bucket's all-reduce")
    for label, widths, cap in CASES:
        report.case(label)
        params = overlap.param_sizes(overlap.make_mlp(widths))
        got = report.answer(label, fn, (list(params), cap), _as_names, "a list of parameter names")
        if got is None:
            continue
        problem = mistake(got, measured_buckets(widths, cap, cluster), params, cap)
        if problem:
            report.fail(f"{label}: {problem}.")
    return raise_or_report(report)
