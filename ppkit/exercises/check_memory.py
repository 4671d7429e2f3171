"""The exercise that ppkit checks for notebook 08b: predict a training step's peak memory, checked by measurement.

    check_predict_peak(fn)   fn(size, seq_len, microbatch_size) -> bytes at the step's peak

``size`` is the lesson's ``step_memory.Size`` (vocab, d_model, heads, layers, ``params()``); the step is one
Adam step of that GPT in fp32 on CPU, no dropout, the attention matrix kept, no recomputation, one
micro-batch. The checker measures each setting with torch's MemTracker (``step_peak.measure_step``) and
accepts a prediction within ``TOLERANCE`` of the measurement: the formula's parts are each that close, and
leaving one out (the optimizer's states, the activations of a layer, backward's transient) is not.
"""

from __future__ import annotations

from ppkit.checks import check_callable
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.lessons import step_memory as sm
from ppkit.lessons import step_peak as sp

TOLERANCE = 0.10
SETTINGS = ((128, 4), (256, 4), (64, 8))  # (sequence length, micro-batch size)
_MEASURED: dict = {}  # (size, s, b) -> bytes: the model and batches are seeded, so a setting's peak is fixed


def measured_peak(size: sm.Size, s: int, b: int) -> int:
    if (size, s, b) not in _MEASURED:
        _MEASURED[size, s, b] = sp.measure_step(size, s, b).total
    return _MEASURED[size, s, b]


def _as_bytes(got):
    return float(got) if isinstance(got, (int, float)) and not isinstance(got, bool) and got > 0 else None


def check_predict_peak(fn, size: sm.Size = sm.SIZE) -> CheckReport | None:
    """Check ``fn(size, seq_len, microbatch_size)`` against the measured peak of each setting in SETTINGS."""
    check_callable(fn, "fn(size, seq_len, microbatch_size)")
    report = CheckReport("predict a step's peak memory")
    for s, b in SETTINGS:
        label = f"s = {s}, micro-batch {b}"
        report.case(label)
        got = report.answer(label, fn, (size, s, b), _as_bytes, "a positive number of bytes")
        if got is None:
            continue
        measured = measured_peak(size, s, b)
        off = got / measured - 1
        if abs(off) > TOLERANCE:
            report.fail(f"{label}: you predicted {got:,.0f} bytes, measured {measured:,} ({off:+.0%}; within "
                        f"{TOLERANCE:.0%} passes). " + ("Too low: what does the step hold that you left out?"
                                                        if off < 0 else "Too high: what did you count twice?"))
    return raise_or_report(report)
