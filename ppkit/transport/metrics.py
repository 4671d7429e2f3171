"""A rank's metrics (loss, tokens/s, MFU, memory: any named numbers), reported per step with
``ppkit.log_metrics`` and sent to the kernel, which plots them live under the cell
(cluster/output/metrics_board.py) and keeps them as data (``ppkit.metrics()``).

The call only appends to lists, in the rank's own thread: no thread of ppkit wakes for it. At most every
``SEND_EVERY_S`` one call sends what gathered as ``Metrics`` messages (a step a millisecond is one message per
0.2 s, not a thousand), and the worker sends the rest before its job's answer (worker.py's ``_sync_output``).
Each message names its job: the kernel drops one that is not the running job's. Outside a ppkit rank (a
script under plain torchrun, a kernel) nothing is sent: the process keeps what it logged, and
``ppkit.metrics()`` there gives it back.
"""

from __future__ import annotations

import numbers
import os
import threading
import time
from dataclasses import dataclass

from ppkit.errors import ConfigError

SEND_EVERY_S = 0.2  # the most often a rank sends its metrics; what comes between waits in lists
RESERVED = ("rank", "step", "time")  # the columns every record has: not names for a metric
VALUES_PER_MESSAGE = 500  # about 12 KiB pickled: a message stays under the channel's 16 KiB write


@dataclass(frozen=True)
class MetricSeries:
    """One metric's values as a rank logged them since its last message: the ``steps``, the wall-clock
    ``times`` (time.time()) and the ``values``, one of each per call, in order."""
    name: str
    steps: tuple[int, ...]
    times: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Metrics:
    """rank -> controller: what a rank logged in job ``job_id`` since its previous ``Metrics``."""
    job_id: int
    series: tuple[MetricSeries, ...]


class _Log:
    """This process's metrics not sent yet (a rank), or all of them (a process outside ppkit)."""

    def __init__(self):
        self.send = None  # a worker's send(msg); None: keep everything here
        self.job: int | None = None  # a rank's current job; None between jobs (what comes then is dropped)
        self.earlier: frozenset[int] = frozenset()  # threads alive as the job began: an earlier job's, kept out
        self.pending: dict[str, tuple[list, list, list]] = {}  # name -> steps, times, values
        self.sent_at = 0.0
        self.calls = 0  # the step of a call that names none
        self.lock = threading.Lock()  # a rank's threads may log at once: a step's three lists stay aligned

    def forked(self) -> None:
        """In a process the rank forks (a DataLoader worker): the lock may have been held by another thread
        of the parent at the fork, and the parent's channel is not the child's. The child keeps its own."""
        self.lock = threading.Lock()
        self.send, self.job, self.pending, self.calls = None, None, {}, 0

    def add(self, step: int, now: float, values: dict[str, float]) -> None:
        if self.send is not None and (self.job is None or threading.get_ident() in self.earlier):
            return  # a rank between jobs, or a thread an earlier job left running: not this job's plot
        with self.lock:
            for name, value in values.items():
                series = self.pending.get(name)
                if series is None:
                    series = self.pending[name] = ([], [], [])
                series[0].append(step)
                series[1].append(now)
                series[2].append(value)
        if self.send is not None and now - self.sent_at >= SEND_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.send is None or not self.pending:
            return
        with self.lock:
            pending, self.pending = self.pending, {}
        self.sent_at = time.time() if now is None else now
        job, chunk, size = self.job, [], 0
        for name, (steps, times, values) in pending.items():
            for i in range(0, len(steps), VALUES_PER_MESSAGE):
                if size and size + min(len(steps) - i, VALUES_PER_MESSAGE) > VALUES_PER_MESSAGE:
                    self.send(Metrics(job, tuple(chunk)))
                    chunk, size = [], 0
                j = i + VALUES_PER_MESSAGE
                chunk.append(MetricSeries(name, tuple(steps[i:j]), tuple(times[i:j]), tuple(values[i:j])))
                size += len(chunk[-1].steps)
        self.send(Metrics(job, tuple(chunk)))


_log = _Log()
os.register_at_fork(after_in_child=_log.forked)


def log_metrics(step: int | None = None, **values) -> None:
    """Report this rank's metrics for one step: ``ppkit.log_metrics(step=i, loss=loss.item(), tokens_per_s=tps)``.

    Each value is a number (a float, an int, a 0-d tensor's ``.item()``); ``step`` (None: one more than this
    rank's previous call) is the plot's x axis. Under ``Cluster.run``, ``ppkit.spawn``, ``ppkit.torchrun`` and
    ``%%torchrun`` the cell shows every metric as a live plot, a line per rank, and ``ppkit.metrics()`` gives
    the values afterwards. Elsewhere (plain torchrun) the process keeps them: ``ppkit.metrics()`` there gives
    its own. The call is cheap enough for every step: it appends to lists and, at most every 0.2 s, sends.
    """
    if step is None:
        step = _log.calls
    elif isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ConfigError(f"log_metrics: step must be a whole number, 0 or more, got {step!r}. "
                          "Give the loop's counter: ppkit.log_metrics(step=i, loss=loss.item()).")
    if not values:
        raise ConfigError("log_metrics was given no metric: name each value, as in "
                          "ppkit.log_metrics(step=i, loss=loss.item(), tokens_per_s=tokens / seconds).")
    checked = {}
    for name, value in values.items():
        if name in RESERVED:
            raise ConfigError(f"log_metrics: {name!r} is a column every record has ({', '.join(RESERVED)}); "
                              f"name the metric otherwise, e.g. my_{name}=...")
        checked[name] = _number(name, value)
    _log.calls = int(step) + 1
    _log.add(int(step), time.time(), checked)


def _number(name: str, value) -> float:
    if isinstance(value, (str, bytes)):  # float("4.5") would pass: a metric read from text is a bug upstream
        raise ConfigError(f"log_metrics: {name}={value!r:.60} is text, not a number. Give a float, an int or "
                          f"a one-element tensor: {name}=loss.item().")
    if hasattr(value, "detach"):  # a tensor: its value, not its graph (float() of one that needs grad warns)
        value = value.detach()
    try:
        return float(value)  # a 0-d tensor too (a CUDA one waits for its stream, as .item() does)
    except OverflowError:
        raise ConfigError(f"log_metrics: {name}={value!r:.60} is too large for a float (at most about "
                          "1.8e308). Log its logarithm, or a scaled value.") from None
    except (TypeError, ValueError):
        raise ConfigError(f"log_metrics: {name}={value!r:.60} is not a number. Give a float, an int or a "
                          f"one-element tensor: {name}=loss.item().") from None


def attach(send) -> None:
    """A ppkit worker's metrics go to the kernel through ``send(msg)`` (worker.py's setup)."""
    _log.send, _log.job, _log.pending, _log.sent_at = send, None, {}, 0.0


def start_job(job_id: int) -> None:
    """A rank's job begins (worker.py): its metrics start empty, a call without ``step=`` counts from 0, and
    the threads already running (an earlier job's) report nothing into it."""
    with _log.lock:
        _log.pending = {}
    _log.job, _log.calls, _log.sent_at = job_id, 0, 0.0
    _log.earlier = frozenset(t.ident for t in threading.enumerate()) - {threading.get_ident()}


def on_a_rank() -> bool:
    """True in a ppkit rank, whose metrics go to the kernel rather than stay here."""
    return _log.send is not None


def flush() -> None:
    """Send what gathered (a worker, before its job's answer and before its process ends)."""
    _log.flush()


def kept() -> list[dict]:
    """What this process logged and kept (outside a ppkit rank): one dict per step, as ``ppkit.metrics()``;
    its rank is RANK's (torchrun's), else 0."""
    rank = os.environ.get("RANK", "0")
    return records({int(rank) if rank.isdigit() else 0: [MetricSeries(name, tuple(s), tuple(t), tuple(v))
                           for name, (s, t, v) in _log.pending.items()]})


def records(by_rank: dict) -> list[dict]:
    """``{rank: [MetricSeries, ...]}`` as one dict per rank and step: ``{"rank", "step", "time", name: value}``
    (the time of the step's first value; a name logged twice in one step keeps its last value)."""
    rows: dict[tuple, dict] = {}
    for rank, series_list in by_rank.items():
        for series in series_list:
            for step, when, value in zip(series.steps, series.times, series.values):
                row = rows.get((rank, step))
                if row is None:
                    row = rows[rank, step] = {"rank": rank, "step": step, "time": when}
                row[series.name] = value
    return sorted(rows.values(), key=lambda row: (row["step"], row["rank"]))
