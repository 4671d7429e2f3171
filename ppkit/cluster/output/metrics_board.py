"""The ranks' metrics in the kernel (what ``ppkit.log_metrics`` sent, transport/metrics.py): drawn live
under the cell while the run goes on, and kept as data once it ends (``ppkit.metrics()``).

A run's first metrics open a display under the cell (an SVG image, metrics_plot.py, and a line of text
with the latest values reduced over the ranks); it is redrawn at most every ``EVERY_S`` through its
``display_id``, and once more as the run ends. Outside a kernel nothing is drawn; the data is kept alike.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
import uuid

from ppkit.cluster.output import metrics_plot
from ppkit.cluster.output.live import in_kernel
from ppkit.errors import ConfigError
from ppkit.transport import metrics as rank_metrics

EVERY_S = 0.5  # the most often the plot is redrawn
_last: list[list[dict]] = []  # the records of the last run that logged metrics in this process (one item)


class MetricsBoard:
    """One cluster's metrics: ``job()`` around each run, ``add`` each ``Metrics`` message, ``tick`` when idle."""

    def __init__(self, every_s: float = EVERY_S):
        self._every_s = every_s
        self._begin()

    def _begin(self) -> None:
        self._received: dict[int, list] = {}  # rank -> its MetricSeries, as they came
        self._lines: dict[str, dict[int, tuple[list, list]]] = {}  # metric -> rank -> (steps, values)
        self._display_id: str | None = None
        self._drawn_at = 0.0
        self._changed = False

    @contextlib.contextmanager
    def job(self):
        """One run: its metrics start empty; at its end the plot is drawn a last time and the records kept."""
        self._begin()
        try:
            yield
        finally:
            self.end()

    def add(self, rank: int, msg: rank_metrics.Metrics, now: float | None = None) -> None:
        self._received.setdefault(rank, []).extend(msg.series)
        for series in msg.series:
            steps, values = self._lines.setdefault(series.name, {}).setdefault(rank, ([], []))
            steps.extend(series.steps)
            values.extend(series.values)
        self._changed = True
        self.tick(now)

    def tick(self, now: float | None = None) -> None:
        """Redraw if something came and the last drawing is ``every_s`` old."""
        now = time.monotonic() if now is None else now
        if self._changed and now - self._drawn_at >= self._every_s:
            self._draw(now)

    def end(self) -> None:
        if self._changed:
            self._draw(time.monotonic())
        if self._received:
            _last[:] = [self.records()]

    def records(self) -> list[dict]:
        """This run's metrics so far: one dict per rank and step, ``{"rank", "step", "time", name: value}``."""
        return rank_metrics.records(self._received)

    def summary(self) -> str:
        """Each metric's latest values, reduced over the ranks: ``step 120: loss 2.33 (2.31…2.35 over 2 ranks)``;
        a rank whose latest value is not finite is named with it: ``loss 2.5 (rank 0: nan)``."""
        parts, last_step = [], 0
        for name, by_rank in self._lines.items():
            latest = {rank: values[-1] for rank, (steps, values) in by_rank.items() if values}
            last_step = max([last_step] + [steps[-1] for steps, _ in by_rank.values() if steps])
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
    rows = [dict(row) for row in (_last[0] if _last else rank_metrics.kept())]
    if not frame:
        return rows
    try:
        import pandas
    except ImportError:
        raise ConfigError("ppkit.metrics(frame=True) needs pandas, which is not installed here: pip install pandas, "
                          "or use ppkit.metrics(), a list of dicts.") from None
    return pandas.DataFrame(rows)
