"""The exercise that ppkit checks for notebook 11: merge two partial attention results (log-sum-exp).

    check_merge_partials(fn)   fn(out_a, lse_a, out_b, lse_b) -> (out, lse) over the keys of A and B

Each case splits the keys of one attention into two parts, computes each part with
``ring_attention.block_attention`` and compares ``fn``'s merge with the attention over all the keys
(computed in float64). It runs in the kernel in a few milliseconds; a wrong answer raises
``ExerciseFailed`` naming the case and the mistake (plain average, missing weights, the max for the
lse, overflow with large scores, NaN where one part saw no keys).
"""

from __future__ import annotations

import torch

from ppkit.checks import check_callable
from ppkit.exercises.report import CheckReport, raise_or_report
from ppkit.lessons.ring_attention import block_attention

NO_KEY = "some rows saw no key of B (out_b 0, lse_b -inf)"
LARGE = "large scores (lse up to ~1000)"


def _attend(q, k, v, keys_seen=None):
    """(out, lse) of q over k, v; rows whose ``keys_seen`` is False saw no key: out 0, lse -inf."""
    out, lse = block_attention(q, k, v)
    if keys_seen is not None:
        out = torch.where(keys_seen.unsqueeze(-1), out, torch.zeros_like(out))
        lse = torch.where(keys_seen, lse, torch.full_like(lse, float("-inf")))
    return out, lse


def merge_cases():
    """(name, (out_a, lse_a, out_b, lse_b), (out, lse) expected): float32 inputs, float64 answers."""
    g = torch.Generator().manual_seed(11)
    cases = []
    for name, split, scale in (("keys split 3 + 5", 3, 1.0), ("keys split 1 + 7", 1, 1.0),
                               (LARGE, 4, 25.0)):
        q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
        q, k = q * scale, k * scale
        parts = _attend(q, k[:, :, :split], v[:, :, :split]) + _attend(q, k[:, :, split:], v[:, :, split:])
        cases.append((name, tuple(t.float() for t in parts), _attend(q, k, v)))
    # A running result always has keys (its first block holds the query's own position); a new block
    # can have none for some rows: there lse_b is -inf and out_b is 0, and the merge must keep A's
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    seen_b = torch.tensor([True, False, True, False, False, True]).expand(1, 2, 6)
    a, b, full = _attend(q, k[:, :, :3], v[:, :, :3]), _attend(q, k[:, :, 3:], v[:, :, 3:], seen_b), _attend(q, k, v)
    want = tuple(torch.where(_rows(seen_b, x), f, x) for x, f in zip(a, full))
    cases.append((NO_KEY, tuple(t.float() for t in a + b), want))
    return cases


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"one tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r:.60}"


def _rows(mask, like):
    return mask.unsqueeze(-1) if like.dim() > mask.dim() else mask


def _close(got, want) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == want.shape
            and bool(torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)))


def _first_wrong(got, want) -> str:
    bad = ~torch.isclose(got.double(), want, rtol=1e-4, atol=1e-5)
    where = tuple(bad.nonzero()[0].tolist())
    return f"at {list(where)} expected {want[where].item():.5g}, got {got.double()[where].item():.5g}"


def _diagnose(name, inputs, want, got) -> str | None:
    out_a, lse_a, out_b, lse_b = (t.double() for t in inputs)
    label = f"{name}:"
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"{label} expected a pair (out, lse), got {_kind(got)}: return both, out and lse"
    out, lse = got
    for what, value, ref, like in (("out", out, want[0], "out_a"), ("lse", lse, want[1], "lse_a")):
        if not isinstance(value, torch.Tensor):
            return f"{label} {what} is {type(value).__name__}, not a tensor"
        if value.shape != ref.shape:
            return f"{label} {what} has shape {tuple(value.shape)}, expected {tuple(ref.shape)} (the shape of {like})"
    if _close(out, want[0]) and _close(lse, want[1]):
        return None
    if _close(lse, torch.maximum(lse_a, lse_b)) and not _close(lse, want[1]):
        return (f"{label} lse is the larger of lse_a and lse_b; the merged lse is "
                "log(exp(lse_a) + exp(lse_b)), a little above the larger one (torch.logaddexp)")
    if _close(lse, lse_a + lse_b):
        return (f"{label} lse is lse_a + lse_b, which multiplies the two denominators; they add: "
                "lse = log(exp(lse_a) + exp(lse_b))")
    if not torch.isfinite(out).all() or not torch.isfinite(lse).all():
        if name == LARGE:
            return (f"{label} the result holds inf or NaN: exp() of a number above ~88 overflows float32, and "
                    f"here lse reaches {lse_a.max().item():.0f}. Subtract the larger lse before taking exp, "
                    "or use torch.logaddexp, so that every exponent is <= 0")
        if name == NO_KEY:
            return (f"{label} the result holds inf or NaN in the rows where B saw no key (lse_b is -inf): "
                    "with lse = torch.logaddexp(lse_a, lse_b) and weights exp(lse_a - lse), exp(lse_b - lse) "
                    "such a part simply gets weight 0")
    if _close(out, (out_a + out_b) / 2):
        return (f"{label} out is the plain average of out_a and out_b; weight each by its share of the "
                "merged softmax denominator, exp(lse_a - lse) and exp(lse_b - lse)")
    if _close(out, out_a + out_b):
        return f"{label} out is out_a + out_b: each needs its weight exp(lse_x - lse), which is below 1"
    if not _close(lse, want[1]):
        return f"{label} lse is wrong {_first_wrong(lse, want[1])}"
    return f"{label} lse is right but out is wrong {_first_wrong(out, want[0])}"


def check_merge_partials(fn) -> CheckReport | None:
    """Check ``fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``: out_x (batch, heads, rows, head_dim) is
    the attention of each query row over the keys of part x, lse_x (batch, heads, rows) the log of its
    softmax denominator; the result is the attention (and lse) over the keys of both parts."""
    check_callable(fn, "fn(out_a, lse_a, out_b, lse_b)")
    report = CheckReport("log-sum-exp merge")
    for name, inputs, want in merge_cases():
        report.case(name)
        try:
            got = fn(*(t.clone() for t in inputs))
        except NotImplementedError:
            print(f"not written yet: replace the NotImplementedError in {getattr(fn, '__name__', fn)}")
            return None
        except Exception as exc:  # the learner's bug is a finding, not a crash of the checker
            shapes = isinstance(exc, RuntimeError) and "must match the size of tensor" in str(exc)
            report.fail(f"{name}: your function raised {type(exc).__name__}: {exc}" + (
                " (lse has one value per row, (batch, heads, rows), and out one row of head_dim values per row: "
                ".unsqueeze(-1) the weights before multiplying out by them)" if shapes else ""))
            continue
        problem = _diagnose(name, inputs, want, got)
        if problem:
            report.fail(problem)
    return raise_or_report(report)
