"""Lesson 08b: a whole training step's peak memory, measured with torch's MemTracker and predicted by formula.

    outside_formula   what autograd keeps outside the blocks: token ids, final norm and head inputs, log-probs
    peak_candidates   the moments that can hold the peak, by part: backward's start (weights and Adam, gradients
                      when accumulating, kept activations, backward's largest transient), optimizer.step() (16
                      bytes per parameter and Adam's temporaries), and with full recomputation the first block's
                      backward
    predicted_peak    the highest of them; peak_moment names it
    measure_step      one optimizer step of ``accumulation_steps`` micro-batches under MemTracker: its peak,
                      by category (parameters, gradients, optimizer, activations, temporaries)
    phase_peaks       the same step's peak in forward and backward, and in ``optimizer.step()``, apart: which
                      is higher depends on Adam's implementation (per tensor, CPU's default, or foreach, CUDA's)
    step_times        the same step's wall time per recompute policy, best of a few, without the tracker

``torch.distributed._tools.mem_tracker.MemTracker`` is a TorchDispatchMode: it sees every tensor that every
operator makes, on any device (here CPU, which has no allocator statistics of its own), and files each under
parameters, buffers, gradients, activations, optimizer states or temporaries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ppkit.errors import ConfigError
from ppkit.lessons import step_memory as sm

LR = 1e-3


def outside_formula(size: sm.Size, s: int, b: int, element_size: int = 4) -> float:
    """Kept outside the blocks: the token ids and targets (int64), the final norm's input, the head's input,
    and cross-entropy's log-probabilities over the vocabulary."""
    e, sbh = element_size, s * b * size.d_model
    return 2 * 8 * s * b + 2 * e * sbh + e * s * b * size.vocab


def activations_formula(size: sm.Size, s: int, b: int, policy: str, element_size: int = 4) -> float:
    """What the step keeps when backward starts, for each recompute policy: every layer's activations (none),
    all but the attention core's (selective: its s x s matrices), or each block's input (full)."""
    e, layers = element_size, size.layers
    per_layer = sm.formula_for(size, s, b, e)
    if sm.check_policy(policy) == "selective" and size.attention == "math":
        per_layer -= e * size.heads * s * s * b
    elif policy == "full":
        per_layer = e * s * b * size.d_model
    return layers * per_layer + outside_formula(size, s, b, e)


def transient_formula(size: sm.Size, s: int, b: int, policy: str, element_size: int = 4) -> float:
    """The most that backward holds at once beyond the kept activations, the larger of two moments.

    At its start, cross-entropy's backward holds two tensors of the logits' size: the gradients of the
    log-probabilities and of the logits (2 s b vocab values). Later, with the attention written out, the last
    layer's softmax backward holds two s x s gradients per head and two of s b h, while the log-probs, the head's
    input and 12 s b h of the last layer (MLP, projection, V) are freed already: 2 a s^2 b - s b (vocab + 10 h)
    values. Selective recomputation adds the rebuilt attention matrix; full, a whole rebuilt block."""
    e = element_size
    cross_entropy = 2 * e * s * b * size.vocab
    later = 0.0
    if size.attention == "math":
        later = e * (2 * size.heads * s * s * b - s * b * (size.vocab + 10 * size.d_model))
        if sm.check_policy(policy) == "selective":
            later += e * size.heads * s * s * b
    if sm.check_policy(policy) == "full":
        later += sm.formula_for(size, s, b, e)
    return max(cross_entropy, later)


def block_params(size: sm.Size) -> int:
    """Parameters of one block: all but the embedding, the final norm and the head, over the layers."""
    return (size.params() - 2 * size.vocab * size.d_model - 2 * size.d_model - size.vocab) // size.layers


def peak_candidates(size: sm.Size, s: int, b: int, accumulation_steps: int = 1, policy: str = "none",
                    foreach: bool = False) -> dict[str, dict]:
    """The moments that can hold the step's peak, each by part (bytes), with its total.

    backward's start      the weights and Adam's two moments (12 bytes per parameter); the gradients only when
                          accumulating (``zero_grad(set_to_none=True)`` freed the last step's, and backward has
                          made few new ones yet; from the second micro-step on the first one's are kept); one
                          micro-batch's kept activations; backward's largest transient
    the first block's backward   (full recomputation only) every gradient but the first block's exists, and that
                          block is rebuilt: its activations, its input, the gradient arriving at it and fc2's
                          input gradient (6 s b h)
    optimizer.step()      weights, gradients and both moments (16 bytes per parameter) and no activations; Adam
                          per tensor (``foreach=False``, torch's default on CPU) adds one parameter's two
                          temporaries (8 bytes x the largest parameter), foreach Adam (CUDA's default)
                          ``sqrt(exp_avg_sq)`` of every parameter at once (4 bytes per parameter)
    """
    check_setting(s, b, accumulation_steps)
    p, accumulating = size.params(), accumulation_steps > 1
    grads = "gradients (4 bytes x parameters, when accumulating)"
    start = {"weights and Adam (12 bytes x parameters)": 12 * p, grads: 4 * p if accumulating else 0,
             "activations kept": activations_formula(size, s, b, policy),
             "backward transient": transient_formula(size, s, b, policy)}
    largest = max(size.vocab * size.d_model, 4 * size.d_model ** 2)
    step = {"weights, gradients and Adam (16 bytes x parameters)": 16 * p,
            "Adam's temporaries (foreach: 4 bytes x parameters; per tensor: 8 x the largest parameter)":
                4 * p if foreach else 8 * largest}
    moments = {"backward's start": start, "optimizer.step()": step}
    if policy == "full":
        sbh = s * b * size.d_model
        moments["the first block's backward"] = {
            "weights and Adam (12 bytes x parameters)": 12 * p,
            "gradients of all but the first block (all when accumulating)":
                4 * (p if accumulating else p - block_params(size)),
            "the first block rebuilt (one layer's activations)": sm.formula_for(size, s, b),
            "its input, the gradient arriving and fc2's input gradient (6 s b h)": 4 * 6 * sbh}
    return {name: {**parts, "total": sum(parts.values())} for name, parts in moments.items()}


def predicted_peak(size: sm.Size, s: int, b: int, accumulation_steps: int = 1, policy: str = "none",
                   foreach: bool = False) -> dict:
    """The step's peak, by part: the highest of ``peak_candidates``. Backward's start holds it when the kept
    activations and backward's transient outweigh what ``optimizer.step()`` adds to the weights and Adam (4 bytes
    per parameter of gradients and one tensor's temporaries with per-tensor Adam; 8 bytes per parameter with
    foreach Adam): a long sequence or a large micro-batch. A short one peaks in the step; with full recomputation,
    in the first block's backward, once the other gradients exist."""
    return max(peak_candidates(size, s, b, accumulation_steps, policy, foreach).values(), key=lambda c: c["total"])


def peak_moment(size: sm.Size, s: int, b: int, accumulation_steps: int = 1, policy: str = "none",
                foreach: bool = False) -> str:
    """Which of ``peak_candidates`` holds the predicted peak."""
    candidates = peak_candidates(size, s, b, accumulation_steps, policy, foreach)
    return max(candidates, key=lambda name: candidates[name]["total"])


def check_setting(s: int, b: int, accumulation_steps: int) -> None:
    for name, value in (("sequence length", s), ("micro-batch size", b), ("accumulation steps", accumulation_steps)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a whole number of at least 1; got {value!r}.")


@dataclass
class StepMemory:
    """One measured step: its setting, peak bytes by category, and the loss."""
    seq_len: int
    microbatch_size: int
    accumulation_steps: int
    policy: str
    peak: dict[str, int] = field(default_factory=dict)
    loss: float = 0.0

    @property
    def total(self) -> int:
        return self.peak["total"]


CATEGORIES = {"Parameter": "params", "Buffer": "buffers", "Gradient": "grads", "Activation": "activations",
              "Temp": "temporaries", "Optstate": "optimizer", "Other": "other", "Total": "total"}


def train_step(model, optimizer, microbatches, autocast: bool = False, after_backward=None) -> float:
    """Gradient accumulation: each micro-batch's loss scaled by 1/k and backpropagated, then one update.
    ``after_backward()``, if given, runs after each micro-batch's backward."""
    total = 0.0
    for tokens in microbatches:
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            loss = model.loss(tokens) / len(microbatches)
        loss.backward()
        total += loss.item()
        if after_backward:
            after_backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def setup(size: sm.Size, s: int, b: int, accumulation_steps: int, policy: str, seed: int = 0,
          foreach: bool | None = None):
    """The model (recomputing as ``policy`` says), Adam with its states made by a first step, the micro-batches.
    ``foreach``: Adam's choice (None: torch's default, per tensor on CPU, foreach on CUDA)."""
    check_setting(s, b, accumulation_steps)
    model = sm.GPT(size, seed).recompute(policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, foreach=foreach)
    microbatches = [sm.batch(size, b, s, seed=10 + i) for i in range(accumulation_steps)]
    train_step(model, optimizer, microbatches[:1])  # Adam's states exist from here on, as in any later step
    return model, optimizer, microbatches


def measure_step(size: sm.Size, s: int, b: int, accumulation_steps: int = 1, policy: str = "none",
                 autocast: bool = False) -> StepMemory:
    """Peak memory of one step (after a first one), by category, from MemTracker; ``autocast``: under
    ``torch.autocast("cpu", bfloat16)``."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model, optimizer, microbatches = setup(size, s, b, accumulation_steps, policy)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        # the tracker's per-module records take one forward each; its peak over the whole step stays
        loss = train_step(model, optimizer, microbatches, autocast, after_backward=tracker.reset_mod_stats)
    snapshot = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    peak = {CATEGORIES[getattr(k, "value", k)]: v for k, v in snapshot.items()}
    return StepMemory(s, b, accumulation_steps, policy, peak, loss)


def _peak_bytes(tracker) -> int:
    snapshot = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {CATEGORIES[getattr(k, "value", k)]: v for k, v in snapshot.items()}["total"]


def phase_peaks(size: sm.Size, s: int, b: int, foreach: bool = False) -> dict[str, int]:
    """Bytes at the peak of one step (after a first one), in forward and backward and in ``optimizer.step()``,
    each measured by a MemTracker of its own. Per-tensor Adam (``foreach=False``) makes one parameter's
    temporaries at a time; foreach Adam (CUDA's default) makes ``sqrt(exp_avg_sq)`` for every parameter at once,
    4 bytes per parameter more while the step runs."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model, optimizer, microbatches = setup(size, s, b, 1, "none", foreach=foreach)
    backward, step = MemTracker(), MemTracker()
    backward.track_external(model, optimizer)
    with backward:
        model.loss(microbatches[0]).backward()
    step.track_external(model, optimizer)
    with step:
        optimizer.step()
    return {"forward and backward": _peak_bytes(backward), "optimizer.step()": _peak_bytes(step)}


def step_times(size: sm.Size, s: int, b: int, policies=sm.POLICIES, accumulation_steps: int = 1,
               repeats: int = 7, autocast: bool = False) -> dict[str, float]:
    """Seconds per step for each policy, the best of ``repeats``, the policies taking turns (so that other
    work on the machine slows them alike); the best is the run least disturbed."""
    runs = {p: setup(size, s, b, accumulation_steps, p) for p in policies}
    best = dict.fromkeys(policies, float("inf"))
    for _ in range(repeats):
        for policy, (model, optimizer, microbatches) in runs.items():
            start = time.perf_counter()
            train_step(model, optimizer, microbatches, autocast=autocast)
            best[policy] = min(best[policy], time.perf_counter() - start)
    return best
