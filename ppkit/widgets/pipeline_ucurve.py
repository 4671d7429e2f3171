"""Two panels the pipeline widget composes: the U-curve and the "cut after: auto" choice.

``UCurvePanel`` measures 1, 2, 4, ... micro-batches against the no-overlap reference
(``ppkit.pipeline.rpc.ucurve``) and shows its own table, plot and the best count's timeline.
``AutoCut`` times every cut when the cut is "auto" (``ppkit.pipeline.rpc.balance``) and shows
them in its own table. Both report in the widget's progress bar and status line.
"""

from __future__ import annotations

import html

import ipywidgets as w

from ppkit.models.resnet import CUT_POINTS
from ppkit.pipeline.rpc import ucurve
from ppkit.pipeline.rpc.config import AUTO_CUT, PipelineConfig
from ppkit.widgets.pipeline_parts import hide, html_table, picture, show, styled, timeline_figure


class UCurvePanel(w.VBox):
    """The U-curve button, and under the results the curve's table, plot and timeline.

    ``prepare()`` (the widget's) returns the checked configuration, its cut resolved, and the
    ``(model, optimizer)`` to measure with; ``progress`` and ``say`` are the widget's.
    """

    def __init__(self, prepare, progress, say):
        self._prepare, self._progress, self._say = prepare, progress, say
        self.curve = None
        self.button = styled(w.Button(
            description="U-curve", tooltip="1, 2, 4, ... micro-batches of this batch against the "
            "no-overlap reference and the bubble bound"), "ucurve")
        self.table = styled(w.HTML(), "ucurve-table")
        self.plot = picture("ucurve-plot")
        self.timeline = picture("ucurve-timeline")
        super().__init__([self.table, self.plot, self.timeline])

    def measure(self):
        """Measure the U-curve at this batch (``ucurve.measure_ucurve``); show its table, plot and
        speed-up line, and return the :class:`UCurve`."""
        config, (model, optimizer) = self._prepare()
        counts = ucurve.default_counts(config.batch_size)
        self._progress.max, self._progress.value = 1, 0
        self._say(f"measuring {', '.join(map(str, counts))} micro-batches, "
                  f"{config.num_batches} round(s) after a warm-up ...")

        def step(done, total):
            self._progress.max, self._progress.value = total, done

        self.curve = curve = ucurve.measure_ucurve(model, optimizer, config, counts, progress=step)
        self.table.value = html_table(curve.rows(), ucurve.COLUMNS, "ppkit-pipeline-ucurve")
        from matplotlib.figure import Figure

        from ppkit.pipeline.plots import plot_ucurve

        fig = Figure(figsize=(9, 3.6), layout="constrained")
        plot_ucurve(fig.subplots(), curve)
        show(self.plot, fig)
        show(self.timeline, timeline_figure(curve.best.run))
        self._say(f"{curve.summary()}; {curve.overhead_line()}")
        return curve

    def clear(self) -> None:
        self.curve = None
        self.table.value = ""
        hide(self.plot)
        hide(self.timeline)


class AutoCut:
    """With cut "auto": time every cut (once per placement and sizes), show them in ``table``, take
    the best. ``before()`` (the widget's) runs first: a live RPC world, and no shards on it."""

    def __init__(self, before, progress, say):
        self._before, self._progress, self._say = before, progress, say
        self.table = styled(w.HTML(), "cuts")
        self._measured_for = None  # the placement and sizes the chosen cut was timed with
        self._chosen = None

    def resolve(self, config: PipelineConfig) -> PipelineConfig:
        if config.cut != AUTO_CUT:
            self.table.value = ""
            return config
        key = (config.placement, config.batch_size, config.image_size, config.stage_threads)
        if self._chosen is None or self._measured_for != key:
            from ppkit.pipeline.rpc.balance import format_candidates, measure_cuts, pick

            self._before()
            self._say(f"cut auto: timing every cut ({', '.join(CUT_POINTS)}) with the whole batch ...")
            self._progress.max, self._progress.value = len(CUT_POINTS), 0
            candidates = measure_cuts(config, rounds=1,
                                      progress=lambda done, _total: setattr(self._progress, "value", done))
            self._measured_for, self._chosen = key, pick(candidates).cut
            self.table.value = ("<b>cut auto</b>: each cut's stages alone on the whole batch<pre>"
                                + html.escape(format_candidates(candidates)) + "</pre>")
        return config.replace(cut=self._chosen)
