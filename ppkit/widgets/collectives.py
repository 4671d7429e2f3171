"""Pick a collective, a world size and a tensor; see every rank's tensor before and after.

    from ppkit.widgets import CollectivesExplorer
    CollectivesExplorer()                 # in a notebook cell

The picture comes from ``ppkit.lessons.collectives.reference``, the plain-Python model of each
collective that notebook 02 and the tests check against real gloo runs. It needs no processes, so
the world size can go to 8 on a laptop.

For tests (pytest or a browser): the controls are ``.op``, ``.world_size``, ``.tensor``,
``.reduce_op`` and ``.numel``; each has a stable ``description`` and a CSS class
(``ppkit-collectives-op``, ``-world-size``, ``-tensor``, ``-reduce-op``, ``-numel``); the summary
(``ppkit-collectives-summary``) and the picture (``ppkit-collectives-output``) redraw on every
change. ``.states`` and ``.figure`` hold what was drawn last; ``.redraws`` counts redraws.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets
from IPython.display import display

from ppkit.lessons import collectives

CSS_PREFIX = "ppkit-collectives"


class CollectivesExplorer:
    """Controls, a summary line and a before/after grid that follow each other."""

    def __init__(self, op: str = "all_reduce", world_size: int = 4, tensor: str = "seed",
                 reduce_op: str = "sum", numel: int = 1):
        self.op = widgets.Dropdown(options=collectives.OPS, value=op, description="collective")
        self.world_size = widgets.IntSlider(value=world_size, min=2, max=8, description="world size",
                                            continuous_update=False)
        self.tensor = widgets.Dropdown(options=collectives.KINDS, value=tensor, description="tensor")
        self.reduce_op = widgets.Dropdown(options=collectives.REDUCE_OPS, value=reduce_op,
                                          description="reduce op")
        self.numel = widgets.IntSlider(value=numel, min=1, max=3, description="numbers/piece",
                                       continuous_update=False)
        self.summary = widgets.HTML()
        self.output = widgets.Output()
        parts = {"op": self.op, "world-size": self.world_size, "tensor": self.tensor,
                 "reduce-op": self.reduce_op, "numel": self.numel, "summary": self.summary,
                 "output": self.output}
        for name, w in parts.items():
            w.add_class(f"{CSS_PREFIX}-{name}")
            if hasattr(w, "description"):
                w.style.description_width = "initial"
        self.widget = widgets.VBox([
            widgets.HBox([self.op, self.world_size, self.tensor]),
            widgets.HBox([self.reduce_op, self.numel]),
            self.summary, self.output])
        self.widget.add_class(CSS_PREFIX)
        self.states: list[dict] = []
        self.figure = None
        self.redraws = 0
        for w in (self.op, self.world_size, self.tensor, self.reduce_op, self.numel):
            w.observe(self._changed, names="value")
        self.redraw()

    def _changed(self, _change) -> None:
        self.redraw()

    def redraw(self) -> None:
        """Recompute every rank's tensor for the current choices and redraw summary and picture."""
        op = self.op.value
        self.reduce_op.disabled = op not in collectives.REDUCING
        self.states = collectives.reference(op, self.world_size.value, self.tensor.value,
                                            self.reduce_op.value, self.numel.value)
        reducing = f" ({self.reduce_op.value})" if op in collectives.REDUCING else ""
        title = f"{op}{reducing}, {self.world_size.value} ranks, tensor: {self.tensor.value}"
        self.figure = collectives.plot_states(self.states, title)
        self.summary.value = self._summary_html(title)
        self.output.clear_output(wait=True)
        with self.output:
            display(self.figure)
        self.redraws += 1

    def _summary_html(self, title: str) -> str:
        cells = "".join(
            f"<td>rank {s['rank']}: {escape(_short(s))}</td>" for s in self.states)
        return (f"<p><b>{escape(title)}</b>. {escape(collectives.DESCRIPTIONS[self.op.value])}</p>"
                f"<table><tr><th>after</th>{cells}</tr></table>")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


def _short(state: dict) -> str:
    if not state["defined"]:
        return "undefined"
    if state["after"] is None:
        return "no tensor"
    return "[" + ", ".join(f"{x:g}" for x in state["after"]) + "]"
