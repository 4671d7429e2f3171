"""Lesson 08c: a training step's FLOPs, counted by formula and by torch, this CPU's peak, MFU and HFU.

    matmul_params     the parameters that multiply (every Linear's weight, the head included); the embedding is
                      a lookup and biases and norms are elementwise, so none of them is in "6N"
    formula_flops     a step's FLOPs by formula: 6N per token, plus attention's 12 L s h per token; with
                      recomputation, the hardware FLOPs add the forward that is run again
    counted_flops     the same step under ``torch.utils.flop_counter.FlopCounterMode``: total and per operator
    measure_peak      this CPU's achievable fp32 matmul rate, best of a few large matmuls (measured, not a datasheet)
    step_seconds      the median wall time of a training step (forward, backward, Adam), per setting, taking turns
    utilization       MFU (model FLOPs / time / peak) and HFU (hardware FLOPs / time / peak)

The peak and the steps are measured with ``THREADS`` torch threads (one; ppkit/lessons/cpu_threads.py says why).

Where the formula comes from: Kaplan et al. 2020 (table 1) count 2N per token for a forward pass (N the
non-embedding parameters) and 3 times that for forward plus backward (backward multiplies twice: the input's
gradient and the weight's): 6N. Attention's two matmuls (Q K^T and the weights times V) add 2 s h FLOPs each per
token and layer in forward, 12 L s h in a training step: the form PaLM (Chowdhery et al. 2022, appendix B) and the
Ultra-Scale Playbook use (Kaplan's table counts only Q K^T, 2 n_layer n_ctx d_attn). A causal kernel may skip the
masked half; the plain attention of lesson 08b computes the whole s x s matrix, as counted here.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from ppkit.errors import ConfigError
from ppkit.lessons import step_compile
from ppkit.lessons import step_memory as sm
from ppkit.lessons import step_peak as sp
from ppkit.lessons.cpu_threads import THREADS, threads  # noqa: F401 - THREADS: what the notebook names


def matmul_params(size: sm.Size) -> int:
    """N of "6N": qkv (3h^2), projection (h^2), MLP (8h^2) per layer, and the head (h x vocab)."""
    return size.layers * 12 * size.d_model ** 2 + size.d_model * size.vocab


def recomputed_per_token(size: sm.Size, s: int, policy: str, early_stop: bool = True) -> int:
    """FLOPs per token that recomputation runs again in backward: the attention core (selective) or each
    block's forward (full). torch's checkpoint stops recomputing once the last tensor backward needs is back
    (``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default): the core's last matmul (weights
    times V) and the block's last Linear (fc2) are not run again, since nothing saved comes out of them."""
    h, layers = size.d_model, size.layers
    qk, av = 2 * s * h * layers, 2 * s * h * layers
    block = 2 * 12 * h * h * layers + qk + av
    if early_stop:
        return {"none": 0, "selective": qk, "full": block - 2 * 4 * h * h * layers}[sm.check_policy(policy)]
    return {"none": 0, "selective": qk + av, "full": block}[sm.check_policy(policy)]


def formula_flops(size: sm.Size, s: int, b: int, policy: str = "none", early_stop: bool = True) -> dict[str, int]:
    """A step of ``b`` sequences of ``s`` tokens: model FLOPs by part, then the hardware FLOPs."""
    tokens, again = s * b, recomputed_per_token(size, s, policy, early_stop)
    parts = {"6N (matmul weights)": 6 * matmul_params(size) * tokens,
             "attention 12 L s h": 12 * size.layers * s * size.d_model * tokens}
    model = sum(parts.values())
    return {**parts, "model": model, "recomputed": again * tokens, "hardware": model + again * tokens}


@dataclass(frozen=True)
class Counted:
    """What FlopCounterMode saw in one forward and backward: the total and the FLOPs per operator."""
    total: int
    by_operator: dict[str, int]


def counted_flops(size: sm.Size, s: int, b: int, policy: str = "none", early_stop: bool = True) -> Counted:
    """One forward and backward of lesson 08b's GPT under FlopCounterMode (recomputation included: what the
    hardware runs). It counts matmuls and attention kernels only; elementwise work is left out."""
    from torch.utils.checkpoint import set_checkpoint_early_stop

    model = sm.GPT(size).recompute(policy)
    tokens = sm.batch(size, b, s)
    with threads(), FlopCounterMode(display=False) as counter, set_checkpoint_early_stop(early_stop):
        model.loss(tokens).backward()
    by_op = {str(op).removeprefix("aten."): n for op, n in counter.get_flop_counts()["Global"].items()}
    return Counted(counter.get_total_flops(), dict(sorted(by_op.items(), key=lambda kv: -kv[1])))


@dataclass(frozen=True)
class Peak:
    """The best fp32 matmul rate measured here: FLOPs per second, the matmul's side, threads, every try."""
    flops_per_s: float
    n: int
    threads: int
    tries: tuple[float, ...]


def measure_peak(n: int = 1024, repeats: int = 5) -> Peak:
    """Time ``repeats`` fp32 matmuls of two n x n matrices (2 n^3 FLOPs each); the fastest is the rate this CPU
    can reach with torch's threads: an achievable peak, below the datasheet's."""
    if n < 64 or repeats < 1:
        raise ConfigError(f"the peak needs a matmul of side >= 64 and at least one try; got n={n}, "
                          f"repeats={repeats}. Use measure_peak(1024, 5).")
    a, b = torch.randn(n, n), torch.randn(n, n)
    tries = []
    with threads():
        a @ b  # the first call pays for start-up
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            tries.append(2 * n ** 3 / (time.perf_counter() - start))
        return Peak(max(tries), n, torch.get_num_threads(), tuple(tries))


@dataclass(frozen=True)
class Setting:
    """One way to run a step: sequence length, micro-batch size, recompute policy, blocks compiled or not."""
    seq_len: int
    microbatch_size: int
    policy: str = "none"
    compiled: bool = False


def _runner(size: sm.Size, setting: Setting):
    model, optimizer, microbatches = sp.setup(size, setting.seq_len, setting.microbatch_size, 1, setting.policy)
    if setting.compiled:
        step_compile.compile_blocks(model)
        sp.train_step(model, optimizer, microbatches)  # compiles forward and backward here, not in the timing
    return lambda: sp.train_step(model, optimizer, microbatches)


def step_seconds(size: sm.Size, settings, repeats: int = 7) -> dict[Setting, float]:
    """The median seconds of a training step (forward, backward, Adam) for each setting, the settings taking
    turns so that other work on the machine slows them alike."""
    settings = list(settings)
    if any(setting.compiled for setting in settings):
        # each compiled setting compiles anew (from Inductor's disk cache): the shapes and policies a kernel compiled
        # before would otherwise count against dynamo's recompile limit (8), past which it runs eager without a word
        torch.compiler.reset()
    with threads():
        runners = {setting: _runner(size, setting) for setting in settings}
        times: dict[Setting, list[float]] = {setting: [] for setting in runners}
        for _ in range(repeats):
            for setting, run in runners.items():
                start = time.perf_counter()
                run()
                times[setting].append(time.perf_counter() - start)
    return {setting: statistics.median(t) for setting, t in times.items()}


def utilization(size: sm.Size, setting: Setting, seconds: float, peak_flops_per_s: float) -> dict[str, float]:
    """MFU counts the model's FLOPs only, HFU also what recomputation runs again: both over time and peak."""
    flops = formula_flops(size, setting.seq_len, setting.microbatch_size, setting.policy)
    return {"seconds": seconds, "model FLOPs": flops["model"], "hardware FLOPs": flops["hardware"],
            "MFU": flops["model"] / seconds / peak_flops_per_s, "HFU": flops["hardware"] / seconds / peak_flops_per_s}
