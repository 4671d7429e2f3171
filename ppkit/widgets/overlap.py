"""Notebook 10b's explorer: DDP's bucket size, or FSDP2's prefetch -> the step's timeline and its overlap.

    from ppkit.widgets import OverlapExplorer
    OverlapExplorer(cluster)      # cluster = ppkit.start(2): every change measures one step on the ranks

Each change runs ``overlap.measure_ddp`` or ``overlap_sharded.measure_fsdp`` on the cluster (a second or
two): the timeline, the communication and the share of it that ran beside compute are measured on this
machine, nothing is a formula. For tests: controls and outputs carry CSS classes
``ppkit-overlap-{what,bucket-cap,forward-prefetch,backward-prefetch,reshard,summary,output}``;
``.measurement`` and ``.figure`` are the last run and drawing, ``.error`` the last refusal, ``.redraws``
counts runs.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets

from ppkit.errors import ConfigError
from ppkit.lessons import overlap, overlap_plots, overlap_sharded
from ppkit.widgets.measured import OneAtATime, measure_and_draw

CSS = "ppkit-overlap"
NO_OVERLAP = "no overlap (notebook 03)"


class OverlapExplorer:
    """Controls, a summary and a measured step of DDP (bucket size) or FSDP2 (prefetch) on ``cluster``."""

    def __init__(self, cluster, what: str = "DDP", bucket_cap_mb: float | str = 0.5):
        if cluster.world_size < 2:
            raise ConfigError(f"the overlap explorer needs at least 2 ranks to communicate; this cluster has "
                              f"{cluster.world_size}: use ppkit.start(2).")
        caps = (*overlap.CAPS_MB, NO_OVERLAP)
        if what not in ("DDP", "FSDP2") or bucket_cap_mb not in caps:
            raise ConfigError(f"what must be 'DDP' or 'FSDP2' (got {what!r}) and bucket_cap_mb one of {caps} "
                              f"(got {bucket_cap_mb!r}).")
        self.cluster = cluster
        self.what = widgets.ToggleButtons(options=("DDP", "FSDP2"), value=what, description="measure")
        self.bucket_cap = widgets.Dropdown(options=caps, value=bucket_cap_mb, description="DDP bucket_cap_mb")
        self.forward_prefetch = widgets.Checkbox(value=False, description="FSDP2 forward prefetch", indent=False)
        self.backward_prefetch = widgets.Checkbox(value=True, description="FSDP2 backward prefetch", indent=False)
        self.reshard = widgets.Checkbox(value=True, description="reshard_after_forward", indent=False)
        self.summary, self.output = widgets.HTML(), widgets.Output()
        controls = {"what": self.what, "bucket-cap": self.bucket_cap, "forward-prefetch": self.forward_prefetch,
                    "backward-prefetch": self.backward_prefetch, "reshard": self.reshard}
        for name, w in {**controls, "summary": self.summary, "output": self.output}.items():
            w.add_class(f"{CSS}-{name}")
            if hasattr(w, "style") and hasattr(w, "description"):
                w.style.description_width = "initial"
        fsdp = widgets.HBox([self.forward_prefetch, self.backward_prefetch, self.reshard])
        self.widget = widgets.VBox([widgets.HBox([self.what, self.bucket_cap]), fsdp, self.summary, self.output])
        self.widget.add_class(CSS)
        self.measurement = self.figure = self.error = None
        self.redraws = 0
        self._redraw = OneAtATime(self._measure_and_draw)
        for w in controls.values():
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def redraw(self) -> None:
        """Measure the current settings on the cluster and draw them (one measurement at a time)."""
        self._redraw()

    def _measure_and_draw(self) -> None:
        ddp = self.what.value == "DDP"
        self.bucket_cap.disabled = not ddp
        for box in (self.forward_prefetch, self.backward_prefetch, self.reshard):
            box.disabled = ddp
        cap = None if self.bucket_cap.value == NO_OVERLAP else self.bucket_cap.value
        flags = (self.forward_prefetch.value, self.backward_prefetch.value, self.reshard.value)

        def measure():
            self.summary.value = "<p>measuring...</p>"
            if ddp:
                return overlap.measure_ddp(self.cluster, cap)
            return overlap_sharded.measure_fsdp(self.cluster, *flags)

        measure_and_draw(self, measure, lambda m: overlap_plots.plot_steps([m]), summary_html)

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def summary_html(m: dict) -> str:
    """One measured setting in a sentence: the step, its communication and how much of it was hidden."""
    if "buckets" in m:
        what = f"{m['buckets']} all-reduce(s) per step"
    else:
        what = f"{m['all_gathers']} all-gathers per step, peak memory {m['peak_bytes'] / 1e6:.2f} MB"
    return (f"<p><b>{escape(m['setting'])}</b>, rank 0: step {m['step']:.1f} ms, communication "
            f"{m['comm']:.1f} ms, of which <b>{overlap.overlap_fraction(m):.0%} ran beside compute</b> "
            f"({m['exposed']:.1f} ms exposed); {what}. Measured on this machine: run it twice and the "
            f"numbers move.</p>")
