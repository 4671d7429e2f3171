"""A rank's metrics (loss, tokens/s, MFU, memory: any named numbers), reported per step with
``ppkit.log_metrics`` and sent to the kernel, which plots them live under the cell
(cluster/output/metrics_board.py) and keeps them as data (``ppkit.metrics()``).

The call only appends to lists, in the rank's own thread: no thread of ppkit wakes for it. At most every
``SEND_EVERY_S`` one call sends what gathered as one ``Metrics`` message (a step a millisecond is one message per
0.2 s, not a thousand), and the worker sends the rest before its job's answer (worker.py's ``_sync_output``).
Outside a ppkit rank (a script under plain torchrun, a kernel) nothing is sent: the process keeps what it
logged, and ``ppkit.metrics()`` there gives it back.
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
    """rank -> controller: what a rank logged since its previous ``Metrics`` (one series per name)."""
    series: tuple[MetricSeries, ...]


class _Log:
    """This process's metrics not sent yet (a rank), or all of them (a process outside ppkit)."""

    def __init__(self):
        self.send = None  # a worker's send(msg); None: keep everything here
        self.pid = 0  # the worker's: a process it forks (a DataLoader's) must not write on its channel
        self.pending: dict[str, tuple[list, list, list]] = {}  # name -> steps, times, values
        self.sent_at = 0.0
        self.calls = 0  # the step of a call that names none
        self.lock = threading.Lock()  # a rank's threads may log at once: a step's three lists stay aligned

    def add(self, step: int, now: float, values: dict[str, float]) -> None:
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
        if os.getpid() != self.pid:  # forked by the rank: its parent's channel is not its own; keep them here
            self.send = None
            return
        with self.lock:
            pending, self.pending = self.pending, {}
        self.sent_at = time.time() if now is None else now
        self.send(Metrics(tuple(MetricSeries(name, tuple(s), tuple(t), tuple(v))
                                for name, (s, t, v) in pending.items())))


_log = _Log()


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
        try:
            checked[name] = float(value)  # a 0-d tensor too (a CUDA one waits for its stream, as .item() does)
        except (TypeError, ValueError):
            raise ConfigError(f"log_metrics: {name}={value!r:.60} is not a number. Give a float, an int or a "
                              f"one-element tensor: {name}=loss.item().") from None
    _log.calls = int(step) + 1
    _log.add(int(step), time.time(), checked)


def attach(send) -> None:
    """A ppkit worker's metrics go to the kernel through ``send(msg)`` (worker.py's setup)."""
    _log.send, _log.pid, _log.pending, _log.sent_at = send, os.getpid(), {}, 0.0


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
