"""Notebook 08c's explorer: sequence length, recomputation and torch.compile -> a step's FLOPs (by formula), its
measured time, and its MFU and HFU against this CPU's measured peak.

    from ppkit.widgets import StepSpeedExplorer
    StepSpeedExplorer(peak)   # peak: step_flops.measure_peak(); every change times real steps in this kernel

Measurements run in the kernel, one at a time (a change arriving meanwhile is measured right after), and are
kept: going back to a setting redraws it without running again; the picture shows every setting measured so far.
For tests: controls and outputs carry CSS classes ``ppkit-speed-{seq-len,recompute,compile,summary,output}``;
``.measurement`` and ``.figure`` are the last run and drawing, ``.redraws`` counts drawings.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display

from ppkit.lessons import step_flops as sf
from ppkit.lessons import step_memory as sm
from ppkit.widgets.measured import OneAtATime, tagged_panel

CSS = "ppkit-speed"
SEQ_LENS = (32, 64, 128, 256)


class StepSpeedExplorer:
    """Controls, a summary and the MFU and HFU of every setting measured, for ``size``'s model."""

    def __init__(self, peak: sf.Peak, size: sm.Size = sm.SIZE, seq_len: int = 128, microbatch_size: int = 4,
                 policy: str = "none", compiled: bool = False, repeats: int = 5):
        self.peak, self.size, self.microbatch_size, self.repeats = peak, size, microbatch_size, repeats
        sf.Setting(seq_len, microbatch_size, sm.check_policy(policy))
        self.seq_len = widgets.Dropdown(options=tuple(sorted({*SEQ_LENS, seq_len})), value=seq_len,
                                        description="sequence length")
        self.recompute = widgets.Dropdown(options=sm.POLICIES, value=policy, description="recompute")
        self.compile = widgets.Checkbox(value=compiled, description="torch.compile the blocks")
        self.summary, self.output = widgets.HTML(), widgets.Output()
        controls = {"seq-len": self.seq_len, "recompute": self.recompute, "compile": self.compile}
        self.widget = tagged_panel(CSS, controls, self.summary, self.output)
        self.measurement = self.figure = None
        self.measured: dict[sf.Setting, dict[str, float]] = {}
        self.redraws, self._one_at_a_time = 0, OneAtATime(self._measure_and_draw)
        for w in controls.values():
            w.observe(lambda _change: self.redraw(), names="value")
        self.redraw()

    def setting(self) -> sf.Setting:
        return sf.Setting(self.seq_len.value, self.microbatch_size, self.recompute.value, self.compile.value)

    def redraw(self) -> None:
        """Measure the chosen setting (or reuse its measurement) and draw every setting measured."""
        self._one_at_a_time()

    def _measure_and_draw(self) -> None:
        setting = self.setting()
        if setting not in self.measured:
            self.summary.value = "<p>timing steps" + (" (compiling first)" if setting.compiled else "") + "...</p>"
            seconds = sf.step_seconds(self.size, [setting], self.repeats)[setting]
            self.measured[setting] = sf.utilization(self.size, setting, seconds, self.peak.flops_per_s)
        self.measurement = self.measured[setting]
        self.figure = self._plot(setting)
        self.summary.value = self._summary_html(setting, self.measurement)
        self.output.clear_output(wait=True)
        with self.output:
            display(self.figure)
        self.redraws += 1

    def _plot(self, current: sf.Setting):
        settings = sorted(self.measured, key=lambda st: (st.seq_len, sm.POLICIES.index(st.policy), st.compiled))
        labels = [f"s={st.seq_len}\n{st.policy}" + ("\ncompiled" if st.compiled else "") for st in settings]
        fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(settings) + 1), 3.0))
        xs = range(len(settings))
        ax.bar([x - 0.2 for x in xs], [100 * self.measured[st]["MFU"] for st in settings], 0.4, label="MFU")
        ax.bar([x + 0.2 for x in xs], [100 * self.measured[st]["HFU"] for st in settings], 0.4, label="HFU")
        ax.set_xticks(list(xs), labels, fontsize=8)
        for tick, st in zip(ax.get_xticklabels(), settings):
            tick.set_fontweight("bold" if st == current else "normal")
        ax.set_ylabel(f"% of the measured peak\n({self.peak.flops_per_s / 1e9:.0f} GFLOP/s)")
        ax.set_title(f"{self.size.layers} layers, d_model {self.size.d_model}, micro-batch {self.microbatch_size}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        plt.close(fig)  # shown through the Output widget only
        return fig

    def _summary_html(self, st: sf.Setting, m: dict[str, float]) -> str:
        flops = sf.formula_flops(self.size, st.seq_len, st.microbatch_size, st.policy)
        six_n, attention = flops["6N (matmul weights)"], flops["attention 12 L s h"]
        return (f"<p><b>s = {st.seq_len}, micro-batch {st.microbatch_size}, recompute {st.policy}, "
                f"{'compiled' if st.compiled else 'eager'}</b>: model FLOPs {flops['model'] / 1e6:.1f} M "
                f"(6N {six_n / 1e6:.1f} M + attention {attention / 1e6:.1f} M),"
                f" hardware FLOPs {flops['hardware'] / 1e6:.1f} M; step {m['seconds'] * 1e3:.1f} ms (median of "
                f"{self.repeats}); MFU {m['MFU']:.1%}, HFU {m['HFU']:.1%} of {self.peak.flops_per_s / 1e9:.1f} "
                "GFLOP/s.</p>")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)
