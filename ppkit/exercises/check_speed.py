"""The exercise that ppkit checks for notebook 08c: predict a step's MFU, checked against the FLOPs torch counts.

    check_predict_mfu(fn)   fn(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops) -> MFU (0..1)

``size`` is lesson 08b's ``step_memory.Size`` (vocab, d_model, heads, layers); ``recompute`` is "none",
"selective" or "full"; ``step_seconds`` is a training step's measured time and ``peak_flops`` this CPU's measured
fp32 matmul rate (FLOPs per second). For settings the notebook never shows, the checker times real steps and hands
the time and the peak to ``fn``: what it checks is the FLOPs, against the model FLOPs ``FlopCounterMode`` counts
(a step without recomputation: MFU counts the model's work only); it accepts an answer within ``TOLERANCE`` of
model FLOPs / time / peak. An answer that matches one of the plausible mistakes (``MISTAKES``) fails with a
message that names it. Kaplan et al.'s N (non-embedding parameters, 12 x layers x d_model^2) is named as his
definition, which leaves out the head, not as a mistake; this exercise counts every matmul, the head's too.
"""

from __future__ import annotations

from ppkit.checks import check_callable
from ppkit.exercises.refused import call_refusing
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.lessons import step_flops as sf
from ppkit.lessons import step_memory as sm

TOLERANCE = 0.01  # the FLOPs are exact and the time and peak are given: only another formula misses
# (size, sequence length, micro-batch size, recompute policy): none of them is shown in the notebook
SETTINGS = ((sm.Size(d_model=96, heads=4, layers=3), 128, 2, "full"),
            (sm.Size(layers=3), 64, 4, "selective"),
            (sm.Size(d_model=32, heads=2, layers=2, vocab=768), 256, 1, "none"))


def _attention(size, s):
    return 12 * size.layers * s * size.d_model


def _kaplan_n(size):
    """Kaplan et al. 2020, table 1: N = 2 d_model n_layer (2 d_attn + d_ff), the non-embedding parameters, with
    d_attn = d_model and d_ff = 4 d_model: 12 n_layer d_model^2, no head."""
    return size.layers * 12 * size.d_model ** 2


def _per_layer_n(size):
    return 12 * size.d_model ** 2


# name -> (FLOPs per token for (size, s, policy), what the message says)
MISTAKES = {
    "no attention": (lambda size, s, p: 6 * sf.matmul_params(size),
                     "you counted 6N but left out attention's 12 x layers x seq_len x d_model per token (Q K^T and "
                     "the weights times V are matmuls whose size grows with the sequence, not parameters)"),
    "half the attention": (lambda size, s, p: 6 * sf.matmul_params(size) + _attention(size, s) / 2,
                           "you counted attention as 6 x layers x seq_len x d_model (Q K^T only, as Kaplan et al.'s "
                           "table, or half of it for the causal mask): this model multiplies the whole s x s matrix "
                           "twice (Q K^T, then the weights times V), 12 L s h per token, as FlopCounterMode counts"),
    "2N": (lambda size, s, p: 2 * sf.matmul_params(size) + _attention(size, s) / 3,
           "you counted the forward pass only (2N): backward multiplies twice more (the input's gradient and the "
           "weight's), so a training step is 6N, and attention's term is 12 L s h, not 4 L s h"),
    "2N, no attention": (lambda size, s, p: 2 * sf.matmul_params(size),
                         "you counted 2N per token: that is the forward pass only, without attention; a training "
                         "step is 6N plus attention's 12 x layers x seq_len x d_model"),
    "recomputation counted": (lambda size, s, p: 6 * sf.matmul_params(size) + _attention(size, s)
                              + sf.recomputed_per_token(size, s, p),
                              "you added the FLOPs that recomputation runs again: that is HFU (hardware FLOPs). "
                              "MFU counts only the model's own FLOPs, whatever the implementation runs twice"),
    "recomputation counted (whole forward)": (
        lambda size, s, p: 6 * sf.matmul_params(size) + _attention(size, s)
        + sf.recomputed_per_token(size, s, p, early_stop=False),
        "you added the forward that recomputation runs again: that is HFU. MFU counts only the model's own FLOPs"),
    "per-layer N": (lambda size, s, p: 6 * _per_layer_n(size) + _attention(size, s),
                    "your N is one layer's (12 d_model^2): N is the whole model's matmul weights, every layer's "
                    "12 d_model^2 times size.layers, plus the head's d_model x vocab"),
    "per-layer N and attention": (lambda size, s, p: 6 * _per_layer_n(size) + _attention(size, s) / size.layers,
                                  "you counted one layer (its 12 d_model^2 weights and its attention): multiply by "
                                  "size.layers, and add the head's d_model x vocab"),
    "Kaplan's N": (lambda size, s, p: 6 * _kaplan_n(size) + _attention(size, s),
                   "you used Kaplan et al.'s N, the non-embedding parameters (12 x layers x d_model^2): by his "
                   "definition N leaves out the head (the de-embedding), which is right for his scaling laws. MFU "
                   "here counts every matmul the step runs, as FlopCounterMode does, and the head is one: add its "
                   "d_model x vocab weights to N"),
    "Kaplan's formula": (lambda size, s, p: 6 * _kaplan_n(size) + _attention(size, s) / 2,
                         "you used Kaplan et al.'s C = 6N + 6 x layers x seq_len x d_model: by his definition N "
                         "leaves out the head, and his attention term counts Q K^T only. MFU here counts every matmul "
                         "the step runs, as FlopCounterMode does: add the head's d_model x vocab to N, and count "
                         "attention as 12 x layers x seq_len x d_model (Q K^T and the weights times V)"),
    "all parameters": (lambda size, s, p: 6 * size.params() + _attention(size, s),
                       "you used size.params(): it counts the embedding table (a lookup, no multiply), biases and "
                       "norms (elementwise). N in 6N is the weights that multiply: 12 d_model^2 per layer plus the "
                       "head's d_model x vocab"),
}
ANSWERS = ("formula_flops", "utilization", "matmul_params")  # the lesson's own formulas: refused inside fn
_MEASURED: dict = {}


def _call_without_answers(fn, *args):
    return call_refusing(fn, args, sf, ANSWERS, "the lesson's own formula, which is this exercise's answer: count "
                         "N and the FLOPs per token yourself from size's fields.")


def _peak() -> float:
    if "peak" not in _MEASURED:
        _MEASURED["peak"] = sf.measure_peak().flops_per_s
    return _MEASURED["peak"]


def measured(size: sm.Size, s: int, b: int, policy: str) -> tuple[float, int]:
    """(median seconds of a real step of this setting, its model FLOPs counted by FlopCounterMode); measured once
    per kernel, so that checking again compares with the same numbers."""
    key = (size, s, b, policy)
    if key not in _MEASURED:
        setting = sf.Setting(s, b, policy)
        seconds = sf.step_seconds(size, [setting], repeats=3)[setting]
        _MEASURED[key] = seconds, sf.counted_flops(size, s, b, "none").total
    return _MEASURED[key]


def _as_fraction(got):
    ok = isinstance(got, (int, float)) and not isinstance(got, bool) and 0 < got
    return float(got) if ok else None


def _mistake(got: float, size, s: int, tokens: int, policy: str, seconds: float, peak: float) -> str | None:
    for name, (per_token, said) in MISTAKES.items():
        wrong = per_token(size, s, policy) * tokens / seconds / peak
        if abs(got / wrong - 1) <= TOLERANCE:
            return f"{said} [{name}]"
    return None


def check_predict_mfu(fn, settings=SETTINGS) -> CheckReport | None:
    """Check ``fn(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops)`` on measured settings."""
    check_callable(fn, "fn(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops)")
    report = CheckReport("predict a step's MFU")
    peak = _peak()
    for size, s, b, policy in settings:
        label = f"{size.layers} layers of d_model {size.d_model}, vocab {size.vocab}, s = {s}, {s * b} tokens, " \
                f"recompute {policy}"
        report.case(label)
        seconds, model_flops = measured(size, s, b, policy)
        got = report.answer(label, _call_without_answers, (fn, size, s, s * b, policy, seconds, peak), _as_fraction,
                            "the MFU as a fraction above 0 (0.25 for 25%)")
        if got is None:
            continue
        mfu = model_flops / seconds / peak
        if abs(got / mfu - 1) <= TOLERANCE:
            continue
        if got > 1 >= mfu * 1.5:
            named = "an MFU above 1: give a fraction (0.25), not a percentage (25)"
        else:
            named = _mistake(got, size, s, s * b, policy, seconds, peak) or (
                "too low: which FLOPs did you leave out?" if got < mfu else "too high: what did you count twice?")
        report.fail(f"{label}: you predicted MFU {got:.4f}, measured {mfu:.4f} ({got / mfu - 1:+.0%}; within "
                    f"{TOLERANCE:.0%} passes): {named}.")
    return raise_or_report(report)
