"""The exercise that ppkit checks for notebook 08b: predict a training step's peak memory, checked by measurement.

    check_predict_peak(fn)   fn(size, seq_len, microbatch_size) -> bytes at the step's peak

``size`` is the lesson's ``step_memory.Size`` (vocab, d_model, heads, layers, attention, ``params()``); the step
is one Adam step (after a first one) in fp32 on CPU, no dropout, no recomputation, one micro-batch. The checker
measures three settings with torch's MemTracker (``step_peak.measure_step``): a short sequence (the weights and
Adam dominate), a longer one (the attention matrices), and a model the notebook never measured a peak of, with
torch's fused attention (``size.attention == "sdpa"``) and a 4x larger vocabulary. It accepts a prediction
within ``TOLERANCE`` (4%) of each: the sum of ``parts`` is within 0.5% of every setting here, and leaving out
any one part that is 5% or more of some setting's peak fails (tests/test_predict_peak_checker.py tries each).
Parts under that stay unseen: the token ids and targets (0.1%), the final norm's and the head's inputs (3% at
most), SDPA's output and log-sum-exp (2%), and any one s b h term of a layer (2.7% at most). A failure names
the part (or the parts of that same size) that the shortfall or the excess matches. ``fn`` may not call
``step_peak``'s own formulas: they are the answer. All three settings peak at the start of backward with per-tensor
Adam (``step_peak.peak_moment``); shorter ones (s = 32, b = 1) peak in ``optimizer.step()``, which ``parts`` does
not describe, so the checker does not use them.
"""

from __future__ import annotations

from ppkit.checks import check_callable
from ppkit.exercises.refused import call_refusing
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.lessons import step_memory as sm
from ppkit.lessons import step_peak as sp

TOLERANCE = 0.04
FUSED = sm.Size(vocab=1024, attention="sdpa")
SETTINGS = ((sm.SIZE, 32, 2), (sm.SIZE, 128, 4), (FUSED, 64, 8))  # (size, sequence length, micro-batch size)
ANSWERS = ("predicted_peak", "activations_formula", "transient_formula", "outside_formula")  # step_peak's
REFUSED = ("the lesson's own prediction of the peak, which is this exercise's answer: add the parts up yourself "
           "from the sizes (sm.kept_formula, one layer's breakdown, you may use).")
_MEASURED: dict = {}  # (size, s, b) -> bytes: the model and batches are seeded, so a setting's peak is fixed
MIB = 2 ** 20


def measured_peak(size: sm.Size, s: int, b: int) -> int:
    if (size, s, b) not in _MEASURED:
        _MEASURED[size, s, b] = sp.measure_step(size, s, b).total
    return _MEASURED[size, s, b]


def parts(size: sm.Size, s: int, b: int) -> dict[str, float]:
    """What the step holds at its peak, the start of backward, by part (bytes): what ``fn`` should add up."""
    a, v, n, p, sbh = size.heads, size.vocab, size.layers, size.params(), s * b * size.d_model
    matrices = 4 * n * a * s * s * b if size.attention == "math" else 0
    return {"the weights (4 bytes x parameters)": 4 * p, "Adam's two moments (8 bytes x parameters)": 8 * p,
            "the norms' inputs (2 s b h per layer)": 4 * n * 2 * sbh,
            "the attention's Q K V, their input and the projection's input (5 s b h per layer)": 4 * n * 5 * sbh,
            "the MLP's activations (9 s b h per layer)": 4 * n * 9 * sbh,
            "the attention matrices (a s^2 b per layer)": matrices,
            "SDPA's output and log-sum-exp (s b h + a s b per layer)": 0 if matrices else 4 * n * (sbh + a * s * b),
            "the token ids and targets (2 s b int64)": 16 * s * b,
            "the final norm's and the head's inputs (2 s b h)": 4 * 2 * sbh,
            "the log-probabilities (s b vocab)": 4 * s * b * v,
            "cross-entropy's backward: gradients of the log-probs and of the logits (2 s b vocab)": 8 * s * b * v}


def _candidates(size: sm.Size, s: int, b: int) -> tuple[dict, dict]:
    """Sizes a shortfall may match (a part, or a group of parts, left out) and an excess may match."""
    each, a_s2b = parts(size, s, b), size.heads * s * s * b
    names = list(each)
    layers = sum(each[k] for k in names[2:7])
    low = {**each, "one layer's activations (you counted fewer layers)": layers / size.layers,
           "every layer's activations": layers,
           "what autograd keeps outside the layers": sum(each[k] for k in names[7:10]),
           "one of cross-entropy's two gradients (s b vocab)": each[names[10]] / 2,
           "the GELU's input or fc2's input (4 s b h per layer)": each[names[4]] * 4 / 9,
           "one of Adam's two moments (4 bytes x parameters)": 4 * size.params()}
    high = {"the gradients (4 bytes x parameters), which do not exist yet at the peak: zero_grad(set_to_none=True) "
            "freed the last step's, and backward has not made new ones": 4 * size.params(),
            "one attention matrix's gradient (a s^2 b)": 4 * a_s2b}
    if size.attention == "sdpa":
        high["the attention matrices (a s^2 b per layer), which SDPA never keeps"] = 4 * size.layers * a_s2b
    return low, {**high, **{f"{k}, counted twice": v for k, v in each.items()}}


def explain(size: sm.Size, s: int, b: int, got: float) -> str:
    """Which part the difference between ``got`` and the sum of ``parts`` is the size of (or that none is)."""
    low, high = _candidates(size, s, b)
    expected = sum(parts(size, s, b).values())
    off = expected - got
    candidates = low if off > 0 else high
    close = sorted((abs(v - abs(off)), k, v) for k, v in candidates.items()
                   if v and abs(v - abs(off)) <= 0.03 * v)
    if close:
        named = " or ".join(f"{k} ({v / MIB:.2f} MiB)" for _, k, v in close[:3])
        return f"That is the size of {named}: " + ("did you leave it out?" if off > 0 else "should it be in your sum?")
    listed = ", ".join(f"{k} {v / MIB:.2f}" for k, v in parts(size, s, b).items() if v)
    return f"No single part is that size; the parts at the peak (MiB): {listed}."


def _as_bytes(got):
    return float(got) if isinstance(got, (int, float)) and not isinstance(got, bool) and got > 0 else None


def _label(size: sm.Size, s: int, b: int) -> str:
    other = "" if size == sm.SIZE else f", vocab {size.vocab}, attention {size.attention!r}"
    return f"s = {s}, micro-batch {b}{other}"


def check_predict_peak(fn, settings=SETTINGS) -> CheckReport | None:
    """Check ``fn(size, seq_len, microbatch_size)`` against the measured peak of each (size, s, b) in ``settings``."""
    check_callable(fn, "fn(size, seq_len, microbatch_size)")
    report = CheckReport("predict a step's peak memory")
    for size, s, b in settings:
        label = _label(size, s, b)
        report.case(label)
        got = report.answer(label, lambda *a: call_refusing(fn, a, sp, ANSWERS, REFUSED), (size, s, b), _as_bytes,
                            "a positive number of bytes")
        if got is None:
            continue
        measured = measured_peak(size, s, b)
        off = got / measured - 1
        if abs(off) > TOLERANCE:
            report.fail(f"{label}: you predicted {got / MIB:.2f} MiB, measured {measured / MIB:.2f} MiB: "
                        f"{abs(got - measured) / MIB:.2f} MiB too {'low' if off < 0 else 'high'} ({off:+.1%}; "
                        f"within {TOLERANCE:.0%} passes). " + explain(size, s, b, got))
    return raise_or_report(report)
