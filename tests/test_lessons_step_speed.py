"""Lesson 08c: a step's FLOPs by formula against FlopCounterMode, the peak, MFU and HFU; torch.compile's kernels;
fp16 loss scaling (underflow, growth, backoff); FP8's formats measured by casting; the explorer; and the predict_mfu
checker against the right answer and each plausible wrong one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import check_speed, solutions
from ppkit.lessons import fp8_formats as f8
from ppkit.lessons import loss_scaling as ls
from ppkit.lessons import step_compile as sc
from ppkit.lessons import step_flops as sf
from ppkit.lessons import step_memory as sm
from ppkit.widgets import StepSpeedExplorer

SIZE = sm.SIZE
WIDE = sm.Size(vocab=100, d_model=32, heads=2, layers=3)


# -- FLOPs -------------------------------------------------------------------------------------------------------

def test_n_is_the_weights_of_every_linear_layer():
    for size in (SIZE, WIDE):
        linear = sum(m.weight.numel() for m in sm.GPT(size).modules() if isinstance(m, nn.Linear))
        assert sf.matmul_params(size) == linear < size.params()


@pytest.mark.parametrize("policy", sm.POLICIES)
@pytest.mark.parametrize("early_stop", [True, False])
def test_the_formula_is_what_flop_counter_mode_counts(policy, early_stop):
    for size, s, b in ((SIZE, 32, 2), (WIDE, 24, 1)):
        formula = sf.formula_flops(size, s, b, policy, early_stop)
        assert sf.counted_flops(size, s, b, policy, early_stop).total == formula["hardware"]
        assert formula["model"] == (6 * sf.matmul_params(size) + 12 * size.layers * s * size.d_model) * s * b


def test_recomputation_adds_hardware_flops_not_model_flops():
    none, full = sf.formula_flops(SIZE, 64, 2), sf.formula_flops(SIZE, 64, 2, "full")
    assert none["model"] == full["model"] == none["hardware"] < full["hardware"]
    u = sf.utilization(SIZE, sf.Setting(64, 2, "full"), seconds=0.01, peak_flops_per_s=1e10)
    assert u["MFU"] == pytest.approx(full["model"] / 0.01 / 1e10) and u["HFU"] > u["MFU"]


def test_the_peak_is_measured_with_one_thread_and_threads_are_restored():
    before = torch.get_num_threads()
    peak = sf.measure_peak(128, 2)
    assert peak.threads == sf.THREADS and len(peak.tries) == 2 and peak.flops_per_s == max(peak.tries) > 0
    assert torch.get_num_threads() == before
    with pytest.raises(ConfigError, match="measure_peak\\(1024, 5\\)"):
        sf.measure_peak(8)
    with pytest.raises(ConfigError, match="threads must be a whole number"):
        with sf.threads(0):
            pass


def test_step_seconds_times_each_setting():
    settings = [sf.Setting(16, 1), sf.Setting(16, 1, "full")]
    times = sf.step_seconds(WIDE, settings, repeats=2)
    assert set(times) == set(settings) and all(t > 0 for t in times.values())


# -- fp16 and loss scaling ---------------------------------------------------------------------------------------

def test_fp16_underflow_and_overflow_are_counted_and_a_scale_moves_them():
    grads = torch.tensor([1e-9, -2e-8, 1e-6, 0.5, 0.0])
    plain = ls.cast_counts(grads)
    assert plain["nonzero"] == 4 and plain["underflow to 0"] == 2 and plain["subnormal"] == 1
    scaled = ls.cast_counts(grads, 2.0 ** 16)
    assert scaled["underflow to 0"] == 0 and scaled["overflow to inf"] == 0
    assert ls.cast_counts(grads, 2.0 ** 24)["overflow to inf"] == 1  # 0.5 x 2^24 > 65504
    with pytest.raises(ConfigError, match="above 0"):
        ls.cast_counts(grads, 0)


@pytest.mark.slow
def test_a_real_fp16_backward_loses_gradients_that_a_scaled_one_keeps():
    reference = ls.fp32_gradients(SIZE, 64, 2)
    lost = ls.fp16_backward(SIZE, 64, 2, scale=1, reference=reference)
    kept = ls.fp16_backward(SIZE, 64, 2, scale=2 ** 8, reference=reference)
    assert lost["lost (0 in fp16, not in fp32)"] > kept["lost (0 in fp16, not in fp32)"]
    assert lost["inf or nan"] == kept["inf or nan"] == 0
    whole_half = ls.fp16_backward(SIZE, 64, 2, scale=2 ** 16, reference=reference)
    assert whole_half["inf or nan"] > 0 and whole_half["loss dtype"] == torch.float16  # the fp16 loss overflows


@pytest.mark.slow
def test_under_autocast_the_loss_is_fp32_and_grad_scalers_default_scale_does_not_overflow():
    """The overflow at 2^16 comes from .half(): under autocast the weights stay fp32 (the master copy) and the loss
    comes out fp32, so GradScaler's default init_scale (2^16) is fine for this model."""
    reference = ls.fp32_gradients(SIZE, 64, 2)
    default = torch.amp.GradScaler("cpu").get_scale()
    assert default == 2 ** 16
    auto = ls.autocast_backward(SIZE, 64, 2, scale=default, reference=reference)
    assert auto["loss dtype"] == torch.float32 and auto["weights dtype"] == torch.float32
    assert auto["inf or nan"] == 0 and auto["lost (0 in fp16, not in fp32)"] == 0
    assert ls.autocast_backward(SIZE, 64, 2, scale=2 ** 24, reference=reference)["inf or nan"] > 0  # fp16 matmuls


def test_grad_scaler_grows_its_scale_and_backs_off_after_an_inf():
    history = ls.scaler_history(steps=7, inject_at=(4,), init_scale=8.0, growth_interval=2, s=16, b=1)
    assert [h.scale for h in history] == [8, 8, 16, 16, 32, 16, 16]
    assert [h.skipped for h in history] == [False] * 4 + [True, False, False]
    assert [h.injected for h in history] == [False] * 4 + [True, False, False]
    with pytest.raises(ConfigError, match="growth_interval"):
        ls.scaler_history(growth_interval=0)


# -- FP8 -----------------------------------------------------------------------------------------------------------

def test_fp8_ranges_and_precision_measured_by_casting():
    table = f8.format_table()
    e4, e5 = table["e4m3fn"], table["e5m2"]
    assert (e4["largest"], e4["smallest normal"], e4["smallest subnormal (cast)"]) == (448, 2 ** -6, 2 ** -9)
    assert (e5["largest"], e5["smallest normal"], e5["smallest subnormal (cast)"]) == (57344, 2 ** -14, 2 ** -16)
    assert table["fp16"]["smallest subnormal (cast)"] == 2 ** -24 and e5["4 x largest becomes"] == float("inf")
    # the worst rounding error of m mantissa bits is 2^-(m+1) / (1 + 2^-(m+1)): 1/17 and 1/9
    assert e4["worst relative error"] == pytest.approx(1 / 17, rel=0.01)
    assert e5["worst relative error"] == pytest.approx(1 / 9, rel=0.01)
    assert e4["median relative error"] < e5["median relative error"] < table["fp16"]["worst relative error"] * 1000


def test_a_per_tensor_scale_keeps_small_values_that_fp8_loses():
    small = torch.full((64,), 1e-4) * torch.linspace(1, 2, 64)
    plain, scaled = f8.scaled_cast(small).values()
    assert plain["lost to 0"] == 64 and scaled["lost to 0"] == 0 and scaled["median relative error"] < 0.07
    assert scaled["scale"] == pytest.approx(448 / 2e-4)
    with pytest.raises(ConfigError, match="floating-point"):
        f8.scaled_cast(torch.arange(4))


def test_scaled_cast_counts_subnormals_and_scales_each_format_to_its_own_largest():
    """Notebook 08c's 1e-4 x randn (seed 0): in e5m2, 1406 of 4096 values are subnormal and 279 become 0 unscaled;
    e5m2's scale is 57344 / amax, not 448 / amax."""
    small = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 1e-4
    plain, scaled = f8.scaled_cast(small, torch.float8_e5m2).values()
    assert (plain["subnormal"], plain["lost to 0"]) == (1406, 279)
    assert scaled["scale"] == pytest.approx(57344 / small.abs().max().item())
    assert scaled["subnormal"] < plain["subnormal"] and scaled["lost to 0"] == 0
    e4_plain, _ = f8.scaled_cast(small).values()
    assert (e4_plain["subnormal"], e4_plain["lost to 0"]) == (0, 4096)


def test_what_runs_here_tries_each_fp8_operation():
    said = f8.what_runs_here(64)
    assert said["cast to e4m3fn and back"].startswith("runs: 1 byte a value")
    assert said["torch._scaled_mm (FP8 matmul) on CPU"].startswith(("runs:", "fails:"))
    assert len(said) == 3


# -- torch.compile -------------------------------------------------------------------------------------------------

def test_no_compiler_is_said_plainly():
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"cpp.cxx": (None, "no-such-c++-compiler")}), \
            pytest.raises(ConfigError, match="apt install g\\+\\+") as err:
        sc.compiled(nn.Linear(2, 2))
    assert "no-such-c++-compiler" in str(err.value)


@pytest.mark.slow
def test_inductor_fuses_the_block_and_its_forward_writes_less():
    sc.require_compiler()
    gen = sc.generated(SIZE, 32, 2)
    assert any("softmax" in k and "masked_fill" in k for k in gen.forward_kernels), gen.forward_kernels
    assert gen.backward_kernels and gen.library_calls.get("bmm", 0) >= 2 and len(gen.files) == 2
    eager = sc.eager_forward_buffers(SIZE, 32, 2)
    assert gen.forward_buffer_bytes < eager["bytes"]
    assert sc.saved_bytes(SIZE, 32, 2, compile=True)["bytes"] <= sc.saved_bytes(SIZE, 32, 2)["bytes"]
    again = sc.generated(SIZE, 32, 2)  # a rerun of the notebook's cell sees the same kernels, from the cache
    assert again.forward_kernels == gen.forward_kernels and again.cache_hits >= 1


# -- the explorer ----------------------------------------------------------------------------------------------------

PEAK = sf.Peak(2e10, 1024, 1, (2e10,))


def test_the_explorer_measures_each_setting_once():
    ex = StepSpeedExplorer(PEAK, WIDE, seq_len=32, microbatch_size=1, repeats=2)
    assert ex.redraws == 1 and len(ex.measured) == 1
    assert "s = 32, micro-batch 1, recompute none, eager" in ex.summary.value and "MFU" in ex.summary.value
    flops = sf.formula_flops(WIDE, 32, 1)
    assert f"model FLOPs {flops['model'] / 1e6:.1f} M" in ex.summary.value
    assert ex.measurement["MFU"] == ex.measurement["HFU"]
    ex.recompute.value = "full"
    assert ex.redraws == 2 and ex.measurement["HFU"] > ex.measurement["MFU"] and "recompute full" in ex.summary.value
    ex.seq_len.value = 64
    assert ex.redraws == 3 and len(ex.measured) == 3 and len(ex.figure.axes[0].patches) == 6
    ex.seq_len.value = 32  # measured already: redrawn, not run again
    assert ex.redraws == 4 and len(ex.measured) == 3
    for name, w in {"seq-len": ex.seq_len, "recompute": ex.recompute, "compile": ex.compile,
                    "summary": ex.summary, "output": ex.output}.items():
        assert f"ppkit-speed-{name}" in w._dom_classes
    with pytest.raises(ConfigError):
        StepSpeedExplorer(PEAK, WIDE, policy="sometimes")


@pytest.mark.slow
def test_the_explorer_compiles_on_request():
    ex = StepSpeedExplorer(PEAK, WIDE, seq_len=32, microbatch_size=1, repeats=2)
    ex.compile.value = True
    assert ex.redraws == 2 and "compiled" in ex.summary.value and ex.measurement["seconds"] > 0


# -- the exercise ------------------------------------------------------------------------------------------------------

def _n(size):
    return size.layers * 12 * size.d_model ** 2 + size.d_model * size.vocab


def no_attention(size, seq_len, tokens, recompute, seconds, peak):
    return 6 * _n(size) * tokens / seconds / peak


def forward_only(size, seq_len, tokens, recompute, seconds, peak):
    return 2 * _n(size) * tokens / seconds / peak


def recomputation_counted(size, seq_len, tokens, recompute, seconds, peak):
    h, layers = size.d_model, size.layers
    extra = {"none": 0, "selective": 4 * seq_len * h * layers, "full": 24 * h * h * layers + 4 * seq_len * h * layers}
    return (6 * _n(size) + 12 * layers * seq_len * h + extra[recompute]) * tokens / seconds / peak


def half_attention(size, seq_len, tokens, recompute, seconds, peak):
    return (6 * _n(size) + 6 * size.layers * seq_len * size.d_model) * tokens / seconds / peak


def forward_only_with_attention(size, seq_len, tokens, recompute, seconds, peak):
    return (2 * _n(size) + 4 * size.layers * seq_len * size.d_model) * tokens / seconds / peak


def recomputation_as_torch_runs_it(size, seq_len, tokens, recompute, seconds, peak):
    model = 6 * _n(size) + 12 * size.layers * seq_len * size.d_model
    hardware = model + sf.recomputed_per_token(size, seq_len, recompute)
    return hardware * tokens / seconds / peak


def per_layer_n(size, seq_len, tokens, recompute, seconds, peak):
    return (6 * 12 * size.d_model ** 2 + 12 * size.layers * seq_len * size.d_model) * tokens / seconds / peak


def all_parameters(size, seq_len, tokens, recompute, seconds, peak):
    return (6 * size.params() + 12 * size.layers * seq_len * size.d_model) * tokens / seconds / peak


def kaplan_n(size, seq_len, tokens, recompute, seconds, peak):
    """Kaplan et al.'s non-embedding N (no head: his definition) with the full attention term."""
    flops = 6 * size.layers * 12 * size.d_model ** 2 + 12 * size.layers * seq_len * size.d_model
    return flops * tokens / seconds / peak


def kaplan_formula(size, seq_len, tokens, recompute, seconds, peak):
    """Kaplan et al.'s C = 6N + 6 n_layer n_ctx d_attn per token, N without the head."""
    flops = 6 * size.layers * 12 * size.d_model ** 2 + 6 * size.layers * seq_len * size.d_model
    return flops * tokens / seconds / peak


def as_percent(*args):
    return 100 * solutions.predict_mfu(*args)


def lesson_formula(size, seq_len, tokens, recompute, seconds, peak):
    return sf.utilization(size, sf.Setting(seq_len, tokens // seq_len), seconds, peak)["MFU"]


@pytest.mark.slow
def test_the_solution_passes():
    report = check_speed.check_predict_mfu(solutions.predict_mfu)
    assert report.passed and len(report.cases) == len(check_speed.SETTINGS)


@pytest.mark.parametrize("wrong, named", [
    (no_attention, "[no attention]"), (forward_only, "[2N, no attention]"), (half_attention, "[half the attention]"),
    (forward_only_with_attention, "[2N]"), (recomputation_as_torch_runs_it, "[recomputation counted]"),
    (recomputation_counted, "[recomputation counted (whole forward)]"), (per_layer_n, "[per-layer N]"),
    (all_parameters, "[all parameters]"), (kaplan_n, "[Kaplan's N]"), (kaplan_formula, "[Kaplan's formula]"),
    (as_percent, "not a percentage"), (lesson_formula, "the lesson's own formula"),
])
def test_each_plausible_wrong_answer_fails_with_its_name(wrong, named):
    with pytest.raises(ExerciseFailed) as err:
        check_speed.check_predict_mfu(wrong)
    assert named in str(err.value), str(err.value)


@pytest.mark.parametrize("kaplan", [kaplan_n, kaplan_formula])
def test_kaplans_n_is_named_as_his_definition_not_as_a_mistake(kaplan):
    """Kaplan et al.'s N leaves out the head by definition: the message says so rather than calling it a slip."""
    with pytest.raises(ExerciseFailed) as err:
        check_speed.check_predict_mfu(kaplan)
    said = str(err.value)
    assert "Kaplan et al.'s" in said and "by his definition" in said, said
    assert "you left out the head" not in said, said



def test_a_stub_and_a_wrong_signature_are_refused():
    def stub(size, seq_len, tokens_per_step, recompute, step_seconds, peak_flops):
        raise NotImplementedError("predict the MFU here")

    with pytest.raises(ExerciseFailed, match="raised NotImplementedError"):
        check_speed.check_predict_mfu(stub)
    with pytest.raises(ConfigError, match="6 argument"):
        check_speed.check_predict_mfu(lambda size, seq_len: 0.5)
