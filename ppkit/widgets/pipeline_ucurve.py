"""The pipeline widget's U-curve button and its "cut after: auto" choice (a mixin of PipelineWidget).

``ucurve()`` measures 1, 2, 4, ... micro-batches against the no-overlap reference
(``ppkit.pipeline.rpc.ucurve``); ``_resolve_cut`` times every cut when the cut is "auto"
(``ppkit.pipeline.rpc.balance``). Both draw into the widget's own table, plots and status line.
"""

from __future__ import annotations

import html
import io

from ppkit.models.resnet import CUT_POINTS
from ppkit.pipeline.rpc import ucurve
from ppkit.pipeline.rpc.config import AUTO_CUT, PipelineConfig

_CELL = 'style="padding:2px 12px;text-align:right"'


class UCurveControls:
    """Needs the widget's ``config()``, ``_ensure_world()``, ``_model_for()``, ``close_model()``,
    ``_say()``, ``progress``, ``table``, ``cuts_table``, ``sweep_plot`` and ``timeline_plot``."""

    curve = None
    _auto_cut: tuple | None = None  # (what it was measured for, the cut it chose)

    def ucurve(self):
        """Measure the U-curve at this batch (1, 2, 4, ... micro-batches; ``ucurve.measure_ucurve``);
        shows its table, plot and speed-up line, and returns the :class:`UCurve`."""
        self._ensure_world()
        config = self._resolve_cut(self.config())
        model, optimizer = self._model_for(config)
        counts = ucurve.default_counts(config.batch_size)
        self.progress.max, self.progress.value = 1, 0
        self._say(f"measuring {', '.join(map(str, counts))} micro-batches, "
                  f"{config.num_batches} round(s) after a warm-up ...")

        def step(done, total):
            self.progress.max, self.progress.value = total, done

        curve = ucurve.measure_ucurve(model, optimizer, config, counts, progress=step)
        self.curve = curve
        self.table.value = html_table(curve.rows(), ucurve.COLUMNS, "ppkit-pipeline-ucurve")
        from matplotlib.figure import Figure

        from ppkit.pipeline.plots import plot_ucurve

        fig = Figure(figsize=(9, 3.6), layout="constrained")
        plot_ucurve(fig.subplots(), curve)
        self.sweep_plot.value = png(fig)
        self.timeline_plot.value = png(timeline_figure(curve.best.run))
        for plot in (self.sweep_plot, self.timeline_plot):
            plot.layout.display = None
        self._say(f"{curve.summary()}; {curve.overhead_line()}")
        return curve

    def _resolve_cut(self, config: PipelineConfig) -> PipelineConfig:
        """With cut "auto": time every cut (once per placement and sizes), show them, take the best."""
        if config.cut != AUTO_CUT:
            self.cuts_table.value = ""
            return config
        key = (config.placement, config.batch_size, config.image_size, config.stage_threads)
        if self._auto_cut is None or self._auto_cut[0] != key:
            from ppkit.pipeline.rpc.balance import format_candidates, measure_cuts, pick

            self._ensure_world()
            self.close_model()
            self._say(f"cut auto: timing every cut ({', '.join(CUT_POINTS)}) with the whole batch ...")
            self.progress.max, self.progress.value = len(CUT_POINTS), 0
            candidates = measure_cuts(config, rounds=1,
                                      progress=lambda done, _total: setattr(self.progress, "value", done))
            self._auto_cut = (key, pick(candidates).cut)
            self.cuts_table.value = ("<b>cut auto</b>: each cut's stages alone on the whole batch<pre>"
                                     + html.escape(format_candidates(candidates)) + "</pre>")
        return config.replace(cut=self._auto_cut[1])


def html_table(rows, columns, css_class: str) -> str:
    head = "".join(f"<th {_CELL}>{html.escape(h)}</th>" for _, h, _ in columns)
    body = "".join("<tr>" + "".join(
        f"<td {_CELL}>{'-' if row[k] is None else fmt.format(row[k])}</td>" for k, _, fmt in columns)
        + "</tr>" for row in rows)
    return f'<table class="{css_class}"><tr>{head}</tr>{body}</table>'


def timeline_figure(run):
    from matplotlib.figure import Figure

    from ppkit.pipeline.plots import plot_run

    fig = Figure(figsize=(11, 3.2), layout="constrained")
    plot_run(fig.subplots(1, 2, sharey=True), run)
    return fig


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
