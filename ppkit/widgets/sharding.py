"""Sliders for notebooks 09 and 10: how much each rank holds and sends, drawn from the formulas.

    from ppkit.widgets.sharding import ZeroExplorer, TensorParallelExplorer
    ZeroExplorer()              # world size, ZeRO stage, model size -> memory and traffic per rank
    TensorParallelExplorer()    # TP degree, model width, tokens -> the MLP block per rank

Both use the formulas that the notebooks check against measured runs (``zero.memory_formula``,
``zero.comm_formula``, ``tensor_parallel.mlp_memory_formula``, ``tensor_parallel.comm_formula``), so
they need no processes. For tests: controls and outputs carry CSS classes
``ppkit-zero-{world-size,stage,params,summary,output}`` and
``ppkit-tp-{degree,d-model,tokens,summary,output}``; ``.figure`` is the last drawing and ``.redraws``
counts redraws.
"""

from __future__ import annotations

from html import escape

import ipywidgets as widgets
from IPython.display import display

from ppkit.lessons import sharding_plots, zero
from ppkit.lessons import tensor_parallel as tp
from ppkit.lessons.sharding_plots import human_bytes

MODEL_SIZES = {"notebook 03's classifier (131)": 131, "GPT-2 small (124M)": 124_000_000,
               "1.3B": 1_300_000_000, "7B": 7_000_000_000, "70B": 70_000_000_000}
STAGE_NAMES = {0: "DDP (no sharding)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}


class _Explorer:
    css = ""

    def _build(self, controls: dict, rows) -> None:
        self.summary, self.output = widgets.HTML(), widgets.Output()
        for name, w in {**controls, "summary": self.summary, "output": self.output}.items():
            w.add_class(f"{self.css}-{name}")
            if hasattr(w, "description"):
                w.style.description_width = "initial"
        self.widget = widgets.VBox([*(widgets.HBox(r) for r in rows), self.summary, self.output])
        self.widget.add_class(self.css)
        self.figure, self.redraws = None, 0
        for w in controls.values():
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def _show(self, figure, summary: str) -> None:
        self.figure = figure
        self.summary.value = summary
        self.output.clear_output(wait=True)
        with self.output:
            display(figure)
        self.redraws += 1

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)


class ZeroExplorer(_Explorer):
    """World size, ZeRO stage and model size -> bytes held and sent per rank, every stage drawn."""

    css = "ppkit-zero"

    def __init__(self, world_size: int = 4, stage: int = 1, params: int = 7_000_000_000):
        self.world_size = widgets.IntSlider(value=world_size, min=1, max=64, description="world size",
                                            continuous_update=False)
        self.stage = widgets.Dropdown(options=[(v, k) for k, v in STAGE_NAMES.items()], value=stage,
                                      description="stage")
        sizes = dict(MODEL_SIZES) if params in MODEL_SIZES.values() else {f"{params:,}": params, **MODEL_SIZES}
        self.params = widgets.Dropdown(options=[(k, v) for k, v in sizes.items()], value=params,
                                       description="parameters")
        self._build({"world-size": self.world_size, "stage": self.stage, "params": self.params},
                    [[self.world_size, self.stage, self.params]])

    def redraw(self) -> None:
        psi, n, s = self.params.value, self.world_size.value, self.stage.value
        memory = zero.memory_formula(psi, n, s)
        parts = ", ".join(f"{k} {human_bytes(v)}" for k, v in memory.items())
        summary = (f"<p><b>{escape(STAGE_NAMES[s])}, {n} ranks, {psi:,} parameters</b>: each rank holds "
                   f"{human_bytes(sum(memory.values()))} ({escape(parts)}) and sends "
                   f"{human_bytes(zero.comm_formula(psi, n, s))} per step.</p>")
        self._show(sharding_plots.plot_zero(psi, n, highlight=s), summary)


class TensorParallelExplorer(_Explorer):
    """TP degree, model width and tokens -> the MLP block's weights, activation and traffic per rank."""

    css = "ppkit-tp"
    DEGREES = (1, 2, 4, 8, 16)

    def __init__(self, degree: int = 2, d_model: int = 4096, tokens: int = 8192):
        self.degree = widgets.SelectionSlider(options=self.DEGREES, value=degree, description="TP degree",
                                              continuous_update=False)
        self.d_model = widgets.Dropdown(options=[8, 768, 4096, 8192], value=d_model, description="d_model")
        self.tokens = widgets.Dropdown(options=[6, 2048, 8192, 32768], value=tokens,
                                       description="tokens per step")
        self._build({"degree": self.degree, "d-model": self.d_model, "tokens": self.tokens},
                    [[self.degree, self.d_model, self.tokens]])

    def redraw(self) -> None:
        t, d, tokens = self.degree.value, self.d_model.value, self.tokens.value
        memory = tp.mlp_memory_formula(t, d, 4 * d, tokens)
        sent = tp.comm_formula("mlp", t, tokens, d)["sent_bytes"]
        summary = (f"<p><b>TP degree {t}, MLP {d} -> {4 * d} -> {d}, {tokens:,} tokens</b>: each rank holds "
                   f"{human_bytes(memory['weights'])} of weights and {human_bytes(memory['activation'])} of "
                   f"hidden activation, and sends {human_bytes(sent)} per forward and backward.</p>")
        self._show(sharding_plots.plot_tensor_parallel(t, d, 4 * d, tokens, self.DEGREES), summary)
