"""Notebook 08b's explorer: sequence length, micro-batch size, accumulation steps and recompute policy -> a step's
peak memory, predicted by formula and measured.

    from ppkit.widgets import StepMemoryExplorer
    StepMemoryExplorer()     # every change measures one training step of the lesson's small GPT in this kernel
                             # (torch's MemTracker), beside the formula's prediction, part by part

Measurements run in the kernel, one at a time (a change arriving meanwhile is measured right after), and are
kept: going back to a setting redraws it without running again. For tests: controls and outputs carry CSS
classes ``ppkit-step-{seq-len,microbatch,accumulation,recompute,summary,output}``; ``.measurement`` and
``.figure`` are the last run and drawing, ``.redraws`` counts drawings.
"""

from __future__ import annotations

import ipywidgets as widgets
from IPython.display import display

from ppkit.lessons import step_memory as sm
from ppkit.lessons import step_peak as sp
from ppkit.lessons import step_plots
from ppkit.widgets.measured import OneAtATime

CSS = "ppkit-step"
SEQ_LENS = (32, 64, 128, 256, 512)


class StepMemoryExplorer:
    """Controls, a summary and the predicted and measured peak of one training step of ``size``'s model."""

    def __init__(self, size: sm.Size = sm.SIZE, seq_len: int = 128, microbatch_size: int = 4,
                 accumulation_steps: int = 1, policy: str = "none"):
        sp.check_setting(seq_len, microbatch_size, accumulation_steps)
        self.size = size
        self.seq_len = widgets.Dropdown(options=tuple(sorted({*SEQ_LENS, seq_len})), value=seq_len,
                                        description="sequence length")
        self.microbatch = widgets.IntSlider(value=microbatch_size, min=1, max=max(16, microbatch_size),
                                            description="micro-batch size", continuous_update=False)
        self.accumulation = widgets.IntSlider(value=accumulation_steps, min=1, max=max(8, accumulation_steps),
                                              description="accumulation steps", continuous_update=False)
        self.recompute = widgets.Dropdown(options=sm.POLICIES, value=sm.check_policy(policy), description="recompute")
        self.summary, self.output = widgets.HTML(), widgets.Output()
        controls = {"seq-len": self.seq_len, "microbatch": self.microbatch, "accumulation": self.accumulation,
                    "recompute": self.recompute}
        for name, w in {**controls, "summary": self.summary, "output": self.output}.items():
            w.add_class(f"{CSS}-{name}")
            if hasattr(w, "description"):
                w.style.description_width = "initial"
        self.widget = widgets.VBox([widgets.HBox([self.seq_len, self.recompute]),
                                    widgets.HBox([self.microbatch, self.accumulation]), self.summary, self.output])
        self.widget.add_class(CSS)
        self.measurement = self.figure = None
        self.measured: dict[tuple, sp.StepMemory] = {}
        self.redraws, self._one_at_a_time = 0, OneAtATime(self._measure_and_draw)
        for w in controls.values():
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def setting(self) -> tuple[int, int, int, str]:
        return self.seq_len.value, self.microbatch.value, self.accumulation.value, self.recompute.value

    def redraw(self) -> None:
        """Measure the chosen setting (or reuse its measurement) and draw it beside the prediction."""
        self._one_at_a_time()

    def _measure_and_draw(self) -> None:
        setting = self.setting()
        if setting not in self.measured:
            self.summary.value = "<p>measuring one step...</p>"
            self.measured[setting] = sp.measure_step(self.size, *setting)
        m = self.measurement = self.measured[setting]
        predicted = sp.predicted_peak(self.size, *setting)
        self.figure = step_plots.plot_peak(m, predicted)
        self.summary.value = self._summary_html(m, predicted)
        self.output.clear_output(wait=True)
        with self.output:
            display(self.figure)
        self.redraws += 1

    @staticmethod
    def _summary_html(m: sp.StepMemory, predicted: dict) -> str:
        mib = step_plots.MIB
        off = m.total / predicted["total"] - 1
        parts = ", ".join(f"{name} {value / mib:.2f}" for name, value in predicted.items() if name != "total")
        held = ", ".join(f"{name} {value / mib:.2f}" for name, value in m.peak.items()
                         if value and name != "total")
        return (f"<p><b>s = {m.seq_len}, micro-batch {m.microbatch_size}, {m.accumulation_steps} accumulation "
                f"step(s), recompute {m.policy}</b>: predicted peak {predicted['total'] / mib:.2f} MiB, "
                f"measured {m.total / mib:.2f} MiB ({off:+.0%}).<br>Predicted (MiB): {parts}.<br>"
                f"Measured at the peak (MiB): {held}.<br>Loss of the step {m.loss:.4f}.</p>")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
