"""The live plot of the ranks' metrics: one small panel per metric, a line per rank, drawn as SVG text.

SVG written here rather than a matplotlib figure: the kernel redraws it every half second while the ranks
train, on the same cores; a matplotlib PNG costs tens of milliseconds of the kernel's CPU per frame, this a
fraction of one (docs/benchmarks.md). Nothing is fetched and no port is opened: the front end shows the
image it is sent. A line keeps at most ``MAX_POINTS`` points (every n-th step, and always the last), and the
axes span the points drawn.
"""

from __future__ import annotations

import html
import math

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf")  # matplotlib's tab10, so that rank r has the colour it has in the course's other plots
WIDTH, HEIGHT, PAD = 300, 150, 48  # PAD: room for a label such as 0.02564 left of the axis
PER_ROW = 3
MAX_POINTS = 400


def svg(lines: dict[str, dict[int, tuple[list, list]]]) -> str:
    """``{metric: {rank: (steps, values)}}`` as one SVG image, a panel per metric."""
    names = list(lines)
    cols = min(PER_ROW, max(1, len(names)))
    rows = max(1, math.ceil(len(names) / cols))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * WIDTH}" height="{rows * HEIGHT}" '
             f'font-family="sans-serif" font-size="11" class="ppkit-metrics">']
    for i, name in enumerate(names):
        parts.append(_panel(name, lines[name], (i % cols) * WIDTH, (i // cols) * HEIGHT))
    parts.append("</svg>")
    return "".join(parts)


def _panel(name: str, by_rank: dict[int, tuple[list, list]], x0: int, y0: int) -> str:
    # only the points drawn are read (at most MAX_POINTS a rank): a redraw costs the same at step 100 and 100 000
    drawn = {rank: [(steps[j], v) for j in _thin(len(steps)) if math.isfinite(v := values[j])]
             for rank, (steps, values) in sorted(by_rank.items())}
    finite = [point for points in drawn.values() for point in points]
    title = html.escape(name)
    out = [f'<g transform="translate({x0},{y0})" class="ppkit-metric" data-name="{title}">',
           f'<text x="{PAD}" y="12" font-weight="bold">{title}</text>']
    if finite:
        s_lo, s_hi = min(s for s, _ in finite), max(s for s, _ in finite)
        v_lo, v_hi = min(v for _, v in finite), max(v for _, v in finite)
        left, top, right, bottom = PAD, 18, WIDTH - 8, HEIGHT - 20
        x_scale = (right - left) / ((s_hi - s_lo) or 1)
        y_scale = (bottom - top) / ((v_hi - v_lo) or (abs(v_hi) or 1.0))
        out.append(f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" '
                   'stroke="#ccc"/>')
        out.append(f'<text x="{left - 2}" y="{top + 8}" text-anchor="end">{_num(v_hi)}</text>'
                   f'<text x="{left - 2}" y="{bottom}" text-anchor="end">{_num(v_lo)}</text>'
                   f'<text x="{left}" y="{HEIGHT - 6}">{s_lo}</text>'
                   f'<text x="{right}" y="{HEIGHT - 6}" text-anchor="end">step {s_hi}</text>')
        for rank, points in drawn.items():
            xy = " ".join(f"{left + (s - s_lo) * x_scale:.1f},{bottom - (v - v_lo) * y_scale:.1f}" for s, v in points)
            out.append(f'<polyline class="ppkit-rank" data-rank="{rank}" data-points="{len(points)}" fill="none" '
                       f'stroke="{COLORS[rank % len(COLORS)]}" stroke-width="1.5" points="{xy}"/>')
        legend = " ".join(f'<tspan fill="{COLORS[r % len(COLORS)]}">■</tspan> {r}' for r in list(drawn)[:8])
        more = " …" if len(drawn) > 8 else ""
        out.append(f'<text x="{right}" y="12" text-anchor="end">rank {legend}{more}</text>')
    out.append("</g>")
    return "".join(out)


def _thin(n: int):
    """The indexes drawn of ``n`` points: every one up to ``MAX_POINTS``, else evenly spread, the last kept."""
    if n <= MAX_POINTS:
        return range(n)
    stride = -(-n // (MAX_POINTS - 1))  # rounded up: at most MAX_POINTS - 1 of them, then the last
    kept = list(range(0, n - 1, stride))
    return kept + [n - 1]


def _num(value: float) -> str:
    return f"{value:.4g}"
