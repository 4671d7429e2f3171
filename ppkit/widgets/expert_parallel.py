"""Notebook 12's explorer: experts, ranks, top-k, capacity factor and router skew -> the MoE layer measured.

    from ppkit.widgets import MoEExplorer
    MoEExplorer(cluster)      # cluster = ppkit.start(4): every change runs one forward and backward of the
                              # expert-parallel layer on ranks 0..ranks-1 and draws where the tokens went

Each change runs ``moe_timing.measure`` on the cluster (a fraction of a second), so nothing here is a
formula: tokens per expert and per rank, dropped tokens, the all_to_all bytes and the step time are
measured. An impossible setting (top-k above the experts, a capacity factor of 0, experts that the ranks
cannot share evenly) is refused in the kernel before anything runs: the summary says which value and what
would work, the last picture stays, and the cluster is untouched. For tests: controls and outputs carry
CSS classes ``ppkit-moe-{experts,ranks,top-k,capacity,skew,summary,output}``; ``.measurement`` and
``.figure`` are the last run and drawing, ``.error`` the last refusal (None after a run), ``.redraws``
counts runs.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets

from ppkit.lessons import moe_timing
from ppkit.widgets.measured import OneAtATime, measure_and_draw

EXPERTS = (1, 2, 3, 4, 6, 8, 12, 16)
CSS = "ppkit-moe"


class MoEExplorer:
    """Controls, a summary and measured pictures of the expert-parallel MoE layer on ``cluster``."""

    def __init__(self, cluster, experts: int = 8, ranks: int | None = None, top_k: int = 2,
                 capacity_factor: float = 1.25, skew: float = 0.0, tokens: int = 1024, hidden: int = 128,
                 ffn: int = 512):
        self.cluster, self.sizes = cluster, {"tokens": tokens, "hidden": hidden, "ffn": ffn}
        ranks = cluster.world_size if ranks is None else ranks
        moe_timing.check_settings(cluster.world_size, ranks, experts=experts, top_k=top_k,  # refuse before drawing
                                  capacity_factor=capacity_factor, skew=skew, **self.sizes)
        options = EXPERTS if experts in EXPERTS else tuple(sorted({*EXPERTS, experts}))
        self.experts = widgets.Dropdown(options=options, value=experts, description="experts")
        self.ranks = widgets.IntSlider(value=ranks, min=1, max=cluster.world_size, description="ranks",
                                       continuous_update=False)
        self.top_k = widgets.IntSlider(value=top_k, min=1, max=max(4, top_k), description="top-k",
                                       continuous_update=False)
        self.capacity = widgets.FloatSlider(value=capacity_factor, min=0.0, max=max(4.0, capacity_factor), step=0.25,
                                            description="capacity factor", continuous_update=False)
        self.skew = widgets.FloatSlider(value=skew, min=0.0, max=max(4.0, skew), step=0.5, description="router skew",
                                        continuous_update=False)
        self.summary, self.output = widgets.HTML(), widgets.Output()
        controls = {"experts": self.experts, "ranks": self.ranks, "top-k": self.top_k, "capacity": self.capacity,
                    "skew": self.skew}
        for name, w in {**controls, "summary": self.summary, "output": self.output}.items():
            w.add_class(f"{CSS}-{name}")
            if hasattr(w, "description"):
                w.style.description_width = "initial"
        rows = [widgets.HBox([self.experts, self.ranks, self.top_k]), widgets.HBox([self.capacity, self.skew])]
        self.widget = widgets.VBox([*rows, self.summary, self.output])
        self.widget.add_class(CSS)
        self.measurement = self.figure = self.error = None
        self.redraws, self._one_at_a_time = 0, OneAtATime(self._measure_and_draw)
        for w in controls.values():
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def settings(self) -> dict:
        return {"experts": self.experts.value, "ranks": self.ranks.value, "top_k": self.top_k.value,
                "capacity_factor": self.capacity.value, "skew": self.skew.value, **self.sizes}

    def redraw(self) -> None:
        """Measure the current settings on the cluster and draw them; or say why they cannot run.

        One at a time: JupyterLab with ipykernel 7 can deliver a widget change on a kernel subshell, in
        another thread, while a measurement runs, and two ``cluster.run`` at once would mix up their jobs.
        A change that arrives meanwhile is measured right after, with the settings of that moment."""
        self._one_at_a_time()

    def _measure_and_draw(self) -> None:
        chosen = self.settings()

        def measure():
            moe_timing.check_settings(self.cluster.world_size, **chosen)
            self.summary.value = "<p>measuring...</p>"
            return moe_timing.measure(self.cluster, **chosen)

        measure_and_draw(self, measure, moe_timing.plot, _summary_html)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def _summary_html(m: moe_timing.Measurement) -> str:
    s, n = m.settings, m.settings.experts_per_rank(m.ranks)
    cell = "<td style='padding: 0 1.2em 0 0'>"
    rows = "".join(
        f"<tr>{cell}rank {r}</td>{cell}{r * n}..{r * n + n - 1}</td>{cell}{m.rows[r]:,}</td>{cell}{m.dropped[r][0]:,}"
        f"</td>{cell}{m.sent[r][0]:,} ({m.sent[r][1]:,})</td>{cell}{m.steps[r] * 1e3:.0f} ms</td></tr>"
        for r in range(m.ranks))
    head = "".join(f"<th style='padding: 0 1.2em 0 0; text-align: left'>{h}</th>" for h in (
        "", "experts", "rows computed", "pairs dropped", "all_to_all bytes (to other ranks)", "step"))
    same = "equal" if m.sent_bytes == m.counted_bytes else "<b>NOT equal</b>"
    return (f"<p><b>{escape(m.title())}</b>: step {m.step_s * 1e3:.0f} ms (forward + backward, slowest rank); "
            f"dropped {m.dropped_pairs:,} of {m.ranks * s.tokens * s.top_k:,} (token, choice) pairs, "
            f"{m.dropped_tokens:,} tokens got no expert; busiest rank / mean = {m.imbalance:.2f}.<br>"
            f"all_to_all: {m.sent_bytes:,} bytes sent, {same} to the counted {sum(m.kept_per_expert):,} pairs x "
            f"{m.row_bytes} bytes x 4 (dispatch and combine, forward and backward); fixed-capacity buffers "
            f"would send {m.padded_bytes:,}.</p><table><tr>{head}</tr>{rows}</table>")
