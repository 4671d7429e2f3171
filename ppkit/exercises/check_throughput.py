"""The exercise that ppkit checks for notebook 13, section 8: predict a mesh's step time.

    check_predict_step(fn)   fn(mesh, compute_s, optimizer_s, links, calls, sent, m) -> seconds

The answer is ``mesh_throughput.predict``'s: for each dimension of degree above 1 its calls x the latency of each
call's link (a send on the pair's link, ("send_recv", 2); a recv is the other side of a send and costs nothing more)
plus its bytes sent over the smallest bandwidth of the links it uses; then GPipe's bubble stretches each
micro-batch's slot, (compute + pp + tp) x (m + pp - 1) / m (Narayanan et al. 2021 stretch a micro-batch's forward
and backward; counting tp's all_reduces and the sends inside the slot is the lesson's extension), and Adam's step
(``optimizer_s``, once after the pipeline has flushed) and dp (an approximation) are added once. Stretching the
compute alone, or the optimizer too, is named as a mistake; where two mistakes give the same number (with tp = 1,
leaving the sends unstretched is stretching only the compute) the failure names both. The cases use made-up links
whose latencies all differ, so that each plausible mistake gives its own number and the failure can name it.
``fn`` may not call ``mesh_throughput.predict``: it is the answer.
"""

from __future__ import annotations

import math
from numbers import Real

from ppkit.checks import check_callable
from ppkit.exercises.refused import call_refusing
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.lessons import mesh_costs as mc
from ppkit.lessons import mesh_throughput as mt

MS = 1e-3
LATENCY = {"all_reduce": (1.0, 3.0), "all_gather": (1.5, 2.5), "reduce_scatter": (2.0, 4.0), "send_recv": (0.5, 0.7)}
BANDWIDTH = {"all_reduce": 4e8, "all_gather": 2e8, "reduce_scatter": 1e8, "send_recv": 8e8}
LINKS = {(kind, n): mt.Link(kind, n, LATENCY[kind][i] * MS, BANDWIDTH[kind] / n)
         for kind in mt.KINDS for i, n in enumerate((2, 4))}
# (mesh, forward and backward seconds, Adam's seconds, calls as CommLog counts them on the busiest rank): three
# meshes of notebook 13
CASES = (((2, 2, 2), 0.050, 0.004, {"dp": {"all_gather": 7, "reduce_scatter": 3}, "pp": {"send": 3, "recv": 3},
                                    "tp": {"all_reduce": 24}}),
         ((2, 4, 1), 0.030, 0.003, {"dp": {"all_gather": 4, "reduce_scatter": 2}, "pp": {"send": 6, "recv": 6},
                                    "tp": {}}),
         ((4, 1, 2), 0.050, 0.006, {"dp": {"all_gather": 9, "reduce_scatter": 5}, "pp": {},
                                    "tp": {"all_reduce": 24}}))
RELATIVE = 1e-6
ANSWERS = ("predict",)  # mesh_throughput's own prediction: refused inside fn
REFUSED = "the lesson's own prediction, which is this exercise's answer: add the parts up yourself."


def _name(mesh) -> str:
    return "x".join(map(str, mesh))


def _mistakes(mesh, compute, calls, sent, m, want: mt.Prediction) -> dict[str, float]:
    """What each plausible wrong answer returns, by the mistake's description, the most specific first."""
    pp = mesh[1]
    step, parts = want.step_s, want.parts
    stretch = (pp - 1) / m
    bytes_term = step - mt.predict(mesh, compute, LINKS, calls, {}).step_s
    out = {
        "the seconds are milliseconds: return seconds, as compute_s is given": step * 1e3,
        "the bytes' time is left out: each dimension also sends sent[dim] bytes over the smallest bandwidth of its "
        "links": step - bytes_term,
        "Adam's step is left out: add optimizer_s once": step - compute.optimizer_s,
    }
    if pp > 1:
        out["Adam's step is stretched by the bubble: it runs once, after the pipeline has flushed, so add "
            "optimizer_s once, outside (m + pp - 1) / m"] = step + compute.optimizer_s * stretch
        slot = compute.forward_backward_s + parts["pp"] + parts["tp"]
        out["you stretched only the compute by (m + pp - 1) / m: tp's all_reduces and the pipeline's sends happen "
            "inside each micro-batch's slot, so in this lesson's model they wait in the bubble too: stretch "
            "compute + pp + tp"] = step - (parts["pp"] + parts["tp"]) * stretch
        out["the pipeline's sends are not stretched: they happen inside each micro-batch's slot, so stretch "
            "compute + pp + tp by (m + pp - 1) / m"] = step - parts["pp"] * stretch
        out["tp's all_reduces are not stretched: they happen inside each micro-batch's slot, so stretch "
            "compute + pp + tp by (m + pp - 1) / m"] = step - parts["tp"] * stretch
        out["dp's traffic is stretched too: the lesson adds it once per step (an approximation: its reduce-scatters "
            "come after the last micro-batch)"] = step + parts["dp"] * stretch
        out["GPipe's bubble is left out: each micro-batch's slot (compute + pp + tp) takes (m + pp - 1) / m as "
            "long"] = step - parts["bubble"]
        out["the bubble is (pp - 1) / (m + pp - 1) of the whole step, not of the slots: compute + pp + tp take "
            "(m + pp - 1) / m as long, x (pp - 1) / m more"] = step - parts["bubble"] + slot * (pp - 1) / (m + pp - 1)
        pp_calls = calls.get("pp", {})
        recv_as_send = {**calls, "pp": {"send": pp_calls.get("send", 0) + pp_calls.get("recv", 0)}}
        out["each recv is counted as a call too: a recv is the other side of a send, whose latency is already "
            "counted"] = mt.predict(mesh, compute, LINKS, recv_as_send, sent).step_s
    if pp > 2:
        out[f"the sends use the link of groups of pp = {pp}: a send goes between two ranks, link "
            "(\"send_recv\", 2)"] = mt.predict(mesh, compute, {**LINKS, ("send_recv", 2): LINKS["send_recv", pp]},
                                               calls, sent).step_s
    return out


def _problem(label, got, mesh, compute, calls, sent, m) -> str | None:
    want = mt.predict(mesh, compute, LINKS, calls, sent)
    if math.isclose(got, want.step_s, rel_tol=RELATIVE):
        return None
    matched = [mistake for mistake, value in _mistakes(mesh, compute, calls, sent, m, want).items()
               if math.isclose(got, value, rel_tol=RELATIVE)]
    if matched:  # more than one where two mistakes give the same number here: name each
        return f"{label}: returned {got:.6g} s, expected {want.step_s:.6g} s: " + "; or ".join(matched)
    parts = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in want.parts.items())
    return (f"{label}: returned {got:.6g} s, expected {want.step_s:.6g} s; the parts are {parts}: compare yours "
            "part by part")


def _seconds(got):
    return float(got) if isinstance(got, Real) and not isinstance(got, bool) and math.isfinite(got) else None


def check_predict_step(fn) -> CheckReport | None:
    """Check ``fn(mesh, compute_s, optimizer_s, links, calls, sent, m)`` (see the module's docstring) on three
    meshes."""
    check_callable(fn, "fn(mesh, compute_s, optimizer_s, links, calls, sent, m)")
    report = CheckReport("predict a step")
    for mesh, compute_s, optimizer_s, calls in CASES:
        label = f"mesh {_name(mesh)}"
        report.case(label)
        sent = mc.comm_formula(mesh)
        m = mt.microbatches(mesh)
        copies = (mesh, compute_s, optimizer_s, dict(LINKS), {d: dict(c) for d, c in calls.items()}, dict(sent), m)
        got = report.answer(label, lambda *a: call_refusing(fn, a, mt, ANSWERS, REFUSED), copies, _seconds,
                            "a number of seconds")
        if got is not None:
            text = _problem(label, got, mesh, mt.Compute(compute_s, optimizer_s), calls, sent, m)
            if text:
                report.fail(text)
    return raise_or_report(report)
