"""Notebook 11's explorer: sequence length, ranks, sharding and causal mask -> ring attention measured.

    from ppkit.widgets import RingAttentionExplorer
    RingAttentionExplorer(cluster)     # cluster = ppkit.start(4): every change runs one forward and
                                       # backward on ranks 0..ranks-1 and draws who computed and who waited

Each change runs ``context_timing.measure`` on the cluster (a second or so), so nothing here is a
formula: the timeline, the compute per rank and the waits are measured. An impossible setting (a
sequence length that the ranks cannot cut evenly, more ranks than the cluster has) is refused in the
kernel before anything runs: the summary says which value and what would work, the last picture
stays, and the cluster is untouched. For tests: controls and outputs carry CSS classes
``ppkit-cp-{seq-len,ranks,sharding,causal,summary,output}``; ``.measurement`` and ``.figure`` are the
last run and drawing, ``.error`` the last refusal (None after a run), ``.redraws`` counts runs.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets

from ppkit.lessons import context_timing
from ppkit.lessons.context_parallel import SHARDINGS
from ppkit.widgets.measured import measure_and_draw

SEQ_LENS = (256, 384, 768, 1024, 1536, 2048, 3072, 4096)
CSS = "ppkit-cp"


class RingAttentionExplorer:
    """Controls, a summary and a measured timeline of ring attention on ``cluster``."""

    def __init__(self, cluster, seq_len: int = 4096, ranks: int | None = None, sharding: str = "zigzag",
                 causal: bool = True, heads: int = 4, head_dim: int = 64):
        self.cluster, self.heads, self.head_dim = cluster, heads, head_dim
        ranks = cluster.world_size if ranks is None else ranks
        context_timing.check_settings(seq_len, ranks, sharding, cluster.world_size)  # refuse before drawing
        options = SEQ_LENS if seq_len in SEQ_LENS else tuple(sorted({*SEQ_LENS, seq_len}))
        self.seq_len = widgets.Dropdown(options=options, value=seq_len, description="sequence length")
        self.ranks = widgets.IntSlider(value=ranks, min=1, max=cluster.world_size, description="ranks",
                                       continuous_update=False)
        self.sharding = widgets.Dropdown(options=SHARDINGS, value=sharding, description="sharding")
        self.causal = widgets.Checkbox(value=causal, description="causal mask", indent=False)
        self.summary, self.output = widgets.HTML(), widgets.Output()
        controls = {"seq-len": self.seq_len, "ranks": self.ranks, "sharding": self.sharding, "causal": self.causal}
        for name, w in {**controls, "summary": self.summary, "output": self.output}.items():
            w.add_class(f"{CSS}-{name}")
            if hasattr(w, "description"):
                w.style.description_width = "initial"
        self.widget = widgets.VBox([widgets.HBox(list(controls.values())), self.summary, self.output])
        self.widget.add_class(CSS)
        self.measurement = self.figure = self.error = None
        self.redraws = 0
        for w in controls.values():
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def redraw(self) -> None:
        """Measure the current settings on the cluster and draw them; or say why they cannot run."""
        settings = (self.seq_len.value, self.ranks.value, self.sharding.value, self.causal.value)

        def measure():
            context_timing.check_settings(*settings[:3], self.cluster.world_size)
            self.summary.value = "<p>measuring...</p>"
            return context_timing.measure(self.cluster, *settings, heads=self.heads, head_dim=self.head_dim)

        measure_and_draw(self, measure, context_timing.plot_timeline, _summary_html)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def _summary_html(m: context_timing.Measurement) -> str:
    cell = "<td style='padding: 0 1.2em 0 0'>"
    rows = "".join(f"<tr>{cell}rank {r}</td>{cell}{c * 1e3:.0f} ms</td>{cell}{w * 1e3:.0f} ms</td>{cell}{n:,}</td></tr>"
                   for r, (c, w, n) in enumerate(zip(m.compute_s, m.wait_s, m.counted)))
    head = "".join(f"<th style='padding: 0 1.2em 0 0; text-align: left'>{h}</th>"
                   for h in ("", "compute (CPU)", "waited", "scores computed"))
    return (f"<p><b>{escape(m.title())}</b>: step {m.step_s * 1e3:.0f} ms (forward + backward, slowest rank); "
            f"compute slowest / mean = {m.imbalance:.2f}.</p><table><tr>{head}</tr>{rows}</table>")
