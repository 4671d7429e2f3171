"""The ranks' metrics in the kernel (what ``ppkit.log_metrics`` sent, transport/metrics.py): drawn live
under the cell while the run goes on, and kept as data once it ends (``ppkit.metrics()``).

A run's first metrics open a display under the cell (an SVG image, metrics_plot.py, and a line of text
with the latest values reduced over the ranks); it is redrawn at most every ``EVERY_S`` through its
``display_id``, and once more as the run ends. Outside a kernel nothing is drawn; the data is kept alike.
The values are kept compactly (``array``: 24 bytes a value, up to ``MAX_KEPT`` a run) and become dicts only
when ``ppkit.metrics()`` asks; the plot reads a bounded copy of each line (``metrics_plot.Trace``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
import uuid
import warnings
from array import array

from ppkit.cluster.output import metrics_plot
from ppkit.cluster.output.live import in_kernel
from ppkit.errors import ConfigError
from ppkit.transport import metrics as rank_metrics

EVERY_S = 0.5  # the most often the plot is redrawn
MAX_KEPT = 4_000_000  # the values a run keeps for ppkit.metrics() (about 96 MB); the plot goes on past it
_last: list[Kept] = []  # the last run's values that logged metrics (or failed) in this process (one item)


class Kept:
    """A run's values as the ranks sent them: ``{rank: {metric: (steps, times, values)}}`` in arrays."""

    def __init__(self):
        self.by_rank: dict[int, dict[str, tuple[array, array, array]]] = {}
        self.count = 0

    def add(self, rank: int, series: rank_metrics.MetricSeries) -> bool:
        """Keep ``series``; False if the run is past ``MAX_KEPT`` values (then nothing more is kept)."""
        if self.count + len(series.steps) > MAX_KEPT:
            return False
        steps, times, values = self.by_rank.setdefault(rank, {}).setdefault(
            series.name, (array("q"), array("d"), array("d")))
        steps.extend(series.steps)
        times.extend(series.times)
        values.extend(series.values)
        self.count += len(series.steps)
        return True

    def records(self) -> list[dict]:
        return rank_metrics.records({rank: [rank_metrics.MetricSeries(name, *columns) for name, columns in
                                            by_name.items()] for rank, by_name in self.by_rank.items()})


class MetricsBoard:
    """One cluster's metrics: ``job(job_id)`` around each run, ``add`` each ``Metrics`` message, ``tick`` when
    idle. A message from another job (a thread an earlier run left behind) is dropped."""

    def __init__(self, every_s: float = EVERY_S):
        self._every_s = every_s
        self._begin(None)

    def _begin(self, job_id: int | None) -> None:
        self._job = job_id
        self._kept = Kept()
        self._full = False
        self._lines: dict[str, dict[int, metrics_plot.Trace]] = {}  # metric -> rank -> its drawn line
        self._display_id: str | None = None
        self._drawn_at = 0.0
        self._changed = False

    @contextlib.contextmanager
    def job(self, job_id: int):
        """One run: its metrics start empty; at its end the plot is drawn a last time and the values kept
        for ``ppkit.metrics()`` if it logged any or failed (a failed re-run leaves no older run's values)."""
        self._begin(job_id)
        failed = True
        try:
            yield
            failed = False
        finally:
            self.end(failed)

    def add(self, rank: int, msg: rank_metrics.Metrics, now: float | None = None) -> None:
        if msg.job_id != self._job:
            return
        for series in msg.series:
            if not self._full and not self._kept.add(rank, series):
                self._full = True
                warnings.warn(f"ppkit.metrics() keeps a run's first {MAX_KEPT:,} values; the ranks logged more, "
                              "and the rest are drawn but not kept. Log every n-th step (if step % 10 == 0: "
                              "ppkit.log_metrics(...)), or write them to files from the ranks.", stacklevel=2)
            trace = self._lines.setdefault(series.name, {}).get(rank)
            if trace is None:
                trace = self._lines[series.name][rank] = metrics_plot.Trace()
            trace.extend(series.steps, series.values)
        self._changed = True
        self.tick(now)

    def tick(self, now: float | None = None) -> None:
        """Redraw if something came and the last drawing is ``every_s`` old."""
        now = time.monotonic() if now is None else now
        if self._changed and now - self._drawn_at >= self._every_s:
            self._draw(now)

    def end(self, failed: bool = False) -> None:
        if self._changed:
            self._draw(time.monotonic())
        if self._kept.by_rank or failed:
            _last[:] = [self._kept]

    def records(self) -> list[dict]:
        """This run's metrics so far: one dict per rank and step, ``{"rank", "step", "time", name: value}``."""
        return self._kept.records()

    def summary(self) -> str:
        """Each metric's latest values, reduced over the ranks: ``step 120: loss 2.33 (2.31…2.35 over 2 ranks)``;
        a rank whose latest value is not finite is named with it: ``loss 2.5 (rank 0: nan)``."""
        parts, last_step = [], 0
        for name, by_rank in self._lines.items():
            latest = {rank: trace.last[1] for rank, trace in by_rank.items() if trace.last}
            last_step = max([last_step] + [trace.last[0] for trace in by_rank.values() if trace.last])
            finite = [v for v in latest.values() if math.isfinite(v)]
            text = f"{name} {statistics.fmean(finite):.4g}" if finite else name
            if len(finite) > 1:
                text += f" ({min(finite):.4g}…{max(finite):.4g} over {len(finite)} ranks)"
            odd = [f"rank {rank}: {value}" for rank, value in sorted(latest.items()) if not math.isfinite(value)]
            parts.append(text + (f" ({', '.join(odd)})" if odd else ""))
        return f"step {last_step}: " + ", ".join(parts)

    def _draw(self, now: float) -> None:
        self._drawn_at, self._changed = now, False
        if not in_kernel():
            return
        from IPython.display import display, update_display

        data = {"image/svg+xml": metrics_plot.svg(self._lines), "text/plain": self.summary()}
        if self._display_id is None:
            self._display_id = f"ppkit-metrics-{uuid.uuid4().hex}"
            sys.stdout.flush()  # what the ranks printed before comes first
            display(data, raw=True, display_id=self._display_id)
        else:
            update_display(data, raw=True, display_id=self._display_id)


def metrics(frame: bool = False):
    """The metrics that the ranks of the last run reported with ``ppkit.log_metrics``, one dict per rank and
    step: ``[{"rank": 0, "step": 0, "time": 1764..., "loss": 2.31}, ...]`` (``time``: time.time() on the rank).
    ``frame=True``: a pandas DataFrame of the same rows (pandas must be installed). In a process that ran no
    such run (a script under plain torchrun), what this process logged itself.

    To see them in TensorBoard as well::

        from torch.utils.tensorboard import SummaryWriter   # pip install tensorboard
        writer = SummaryWriter("runs/capstone")
        for row in ppkit.metrics():
            writer.add_scalar(f"loss/rank{row['rank']}", row["loss"], row["step"])
        writer.close()
    """
    if rank_metrics.on_a_rank():
        raise ConfigError("ppkit.metrics() was called on a ppkit rank: this rank's values went to the kernel as "
                          "it logged them, and only the kernel has them all. Call ppkit.metrics() in the notebook "
                          "after the run (or return what the rank needs from its function).")
    rows = _last[0].records() if _last else rank_metrics.kept()
    if not frame:
        return rows
    try:
        import pandas
    except ImportError:
        raise ConfigError("ppkit.metrics(frame=True) needs pandas, which is not installed here: pip install pandas, "
                          "or use ppkit.metrics(), a list of dicts.") from None
    return pandas.DataFrame(rows)
