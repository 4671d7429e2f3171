"""The live plot of the ranks' metrics: one small panel per metric, a line per rank, drawn as SVG text.

SVG written here rather than a matplotlib figure: the kernel redraws it every half second while the ranks
train, on the same cores, and a frame here reads only what it draws (a ``Trace`` of at most ``MAX_BUCKETS``
buckets a line, whatever the run's length). Nothing is fetched and no port is opened: the front end shows
the image it is sent. A line keeps each bucket's lowest and highest value, so a spike stays visible however
long the run; the axes span what is drawn.
"""

from __future__ import annotations

import html
import math

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")  # matplotlib's tab10, so that rank r has the colour it has in the course's other plots
WIDTH, HEIGHT, PAD = 300, 160, 48  # PAD: room for a label such as 0.02564 left of the axis
LEFT, TOP, RIGHT, BOTTOM = PAD, 32, WIDTH - 8, HEIGHT - 20  # the plot area: title, then legend, above it
PER_ROW = 3
MAX_BUCKETS = (RIGHT - LEFT) // 2  # a bucket draws its low and its high: about one point a pixel
TITLE_CHARS = 40  # what fits across a panel at 11 px; a longer name is cut, its whole in the tooltip


class Trace:
    """One rank's line of one metric, kept bounded for drawing: consecutive steps in at most
    ``MAX_BUCKETS`` buckets, each its lowest and highest finite value (and their steps); when full,
    neighbours merge and a bucket holds twice as many steps. Adding a value costs the same at any length."""

    def __init__(self):
        self.buckets: list[list] = []  # [low, step_at_low, high, step_at_high, count]
        self.per_bucket = 1
        self.last: tuple[int, float] | None = None  # the latest (step, value), finite or not

    @classmethod
    def of(cls, steps, values) -> Trace:
        trace = cls()
        for step, value in zip(steps, values):
            trace.add(step, value)
        return trace

    def add(self, step: int, value: float) -> None:
        self.last = (step, value)
        if not math.isfinite(value):
            return  # left out of the line; the summary names it
        b = self.buckets[-1] if self.buckets else None
        if b is None or b[4] >= self.per_bucket:
            self.buckets.append([value, step, value, step, 1])
            if len(self.buckets) > MAX_BUCKETS:
                self._halve()
            return
        if value < b[0]:
            b[0], b[1] = value, step
        if value > b[2]:
            b[2], b[3] = value, step
        b[4] += 1

    def extend(self, steps, values) -> None:
        """``add`` each; a long, finite run of values goes a bucket at a time (min and max in C)."""
        if len(values) < 4 * self.per_bucket or not math.isfinite(sum(values)):
            for step, value in zip(steps, values):
                self.add(step, value)
            return
        i, n = 0, len(values)
        while i < n and self.buckets and self.buckets[-1][4] < self.per_bucket:  # the open bucket first
            self.add(steps[i], values[i])
            i += 1
        while i < n:
            chunk = values[i:i + self.per_bucket]
            low, high = min(chunk), max(chunk)
            self.buckets.append([low, steps[i + chunk.index(low)], high, steps[i + chunk.index(high)], len(chunk)])
            if len(self.buckets) > MAX_BUCKETS:
                self._halve()
            i += len(chunk)
        self.last = (steps[-1], values[-1])

    def _halve(self) -> None:
        merged = []
        for i in range(0, len(self.buckets) - 1, 2):
            a, b = self.buckets[i], self.buckets[i + 1]
            merged.append([*(a[:2] if a[0] <= b[0] else b[:2]), *(a[2:4] if a[2] >= b[2] else b[2:4]), a[4] + b[4]])
        if len(self.buckets) % 2:
            merged.append(self.buckets[-1])
        self.buckets, self.per_bucket = merged, self.per_bucket * 2

    def points(self) -> list[tuple[int, float]]:
        """The points drawn, in step order: a bucket's low and high (one point where they are one), and the
        latest value, so that the line ends at the step the rank is at."""
        out = []
        for low, s_low, high, s_high, _ in self.buckets:
            if s_low == s_high:
                out.append((s_low, low))
            else:
                out.extend(sorted(((s_low, low), (s_high, high))))
        if out and self.last and math.isfinite(self.last[1]) and self.last[0] > out[-1][0]:
            out.append(self.last)
        return out


def svg(lines: dict[str, dict[int, Trace]]) -> str:
    """``{metric: {rank: Trace}}`` as one SVG image, a panel per metric."""
    names = list(lines)
    cols = min(PER_ROW, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * WIDTH}" height="{rows * HEIGHT}" '
             f'font-family="sans-serif" font-size="11" class="ppkit-metrics">']
    for i, name in enumerate(names):
        parts.append(_panel(name, lines[name], (i % cols) * WIDTH, (i // cols) * HEIGHT))
    parts.append("</svg>")
    return "".join(parts)


def _panel(name: str, by_rank: dict[int, Trace], x0: int, y0: int) -> str:
    drawn = {rank: trace.points() for rank, trace in sorted(by_rank.items())}
    finite = [point for points in drawn.values() for point in points]
    title = html.escape(name)
    shown = html.escape(name if len(name) <= TITLE_CHARS else name[:TITLE_CHARS - 1] + "…")
    out = [f'<g transform="translate({x0},{y0})" class="ppkit-metric" data-name="{title}">',
           f'<text x="{PAD}" y="12" font-weight="bold" class="ppkit-title"><title>{title}</title>{shown}</text>']
    if finite:
        s_lo, s_hi = min(s for s, _ in finite), max(s for s, _ in finite)
        v_lo, v_hi = min(v for _, v in finite), max(v for _, v in finite)
        x_scale = (RIGHT - LEFT) / ((s_hi - s_lo) or 1)
        y_scale = (BOTTOM - TOP) / ((v_hi - v_lo) or (abs(v_hi) or 1.0))
        out.append(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" '
                   'stroke="#ccc"/>')
        out.append(f'<text x="{LEFT - 2}" y="{TOP + 8}" text-anchor="end">{_num(v_hi)}</text>'
                   f'<text x="{LEFT - 2}" y="{BOTTOM}" text-anchor="end">{_num(v_lo)}</text>'
                   f'<text x="{LEFT}" y="{HEIGHT - 6}">{s_lo}</text>'
                   f'<text x="{RIGHT}" y="{HEIGHT - 6}" text-anchor="end">step {s_hi}</text>')
        for rank, points in drawn.items():
            xy = " ".join(f"{round(LEFT + (s - s_lo) * x_scale)},{round(BOTTOM - (v - v_lo) * y_scale)}"
                          for s, v in points)
            out.append(f'<polyline class="ppkit-rank" data-rank="{rank}" data-points="{len(points)}" fill="none" '
                       f'stroke="{COLORS[rank % len(COLORS)]}" stroke-width="1.5" points="{xy}"/>')
        legend = " ".join(f'<tspan fill="{COLORS[r % len(COLORS)]}">■</tspan> {r}' for r in list(drawn)[:8])
        more = " …" if len(drawn) > 8 else ""
        out.append(f'<text x="{RIGHT}" y="26" text-anchor="end" class="ppkit-legend">rank {legend}{more}</text>')
    out.append("</g>")
    return "".join(out)


def _num(value: float) -> str:
    return f"{value:.4g}"
