"""Lesson 14, the capstone: the small Llama on shipped text; its runs on a 4-rank and an 8-rank mesh (FSDP2, DTensor
TP with SP, pipelining) equal the one-process run step by step; a DCP checkpoint saved on dp2 x tp2 resumes on tp4
and on pp2 x dp2 and continues the reference's curve; bad input is refused with what would work."""

from __future__ import annotations

import os

import pytest
import torch

import ppkit
from ppkit import data
from ppkit.errors import ConfigError
from ppkit.lessons import capstone as cap
from ppkit.lessons import capstone_checkpoint as ckpt
from ppkit.lessons import capstone_speed as cs
from ppkit.models import llama

pytestmark = pytest.mark.timeout(900)
STEPS = 4


@pytest.fixture(scope="module")
def cluster8():
    with ppkit.Cluster(8, "gloo", timeout=300) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def recorded():
    """The one-process run with every step's loss and gradients recorded (ppkit.ParityRecorder)."""
    recorder = ppkit.ParityRecorder()
    cap.reference(steps=STEPS, recorder=recorder)
    return recorder


@pytest.fixture(scope="module")
def reference():
    return cap.reference(steps=STEPS)


def _within(losses, want):
    assert len(losses) == len(want)
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want))
    assert worst <= cap.TOLERANCE, (losses, want, worst)
    return worst


def _same_gradients(recorded, results, steps):
    """Every gradient by name equals the one-process run's (compare_runs): the loss alone misses a gradient scaled
    by a constant, which Adam divides out (a dp sum instead of a mean moves the loss by ~1e-6)."""
    report = ppkit.compare_runs(recorded, [r["parity"] for r in results if r is not None])
    assert report.equal, report
    assert report.steps == steps
    return report


TP_ROWS = "Shard(dim=0)"  # a column-parallel weight over tp: each rank its heads' rows


# -- the pieces ----------------------------------------------------------------------------------------------------
def test_the_text_ships_and_the_tokenizer_is_bytes():
    text = data.text()
    assert 100_000 < len(text) < 2_000_000 and text.startswith("In the beginning God created")
    ids = data.encode("Let there be light: é")
    assert ids.dtype == torch.int64 and int(ids.max()) < data.VOCAB and len(ids) == len("Let there be light: é") + 1
    assert data.decode(ids) == "Let there be light: é"


def test_an_unknown_text_is_refused_with_what_ships():
    with pytest.raises(ConfigError, match="kjv_genesis_exodus.txt"):
        data.text("shakespeare.txt")


def test_the_model_parts():
    c = llama.Config()
    model = llama.Llama(c)
    assert sum(p.numel() for p in model.parameters()) == c.params()
    assert model(torch.zeros(2, c.seq, dtype=torch.long)).shape == (2, c.seq, c.vocab)
    # RoPE: position 0 is not turned, and a rotation keeps each pair's length
    x = torch.randn(1, 1, c.seq, c.head_dim)
    cos, sin = llama.rope_tables(c)
    y = llama.apply_rope(x, cos, sin)
    assert torch.equal(y[..., 0, :], x[..., 0, :]) and not torch.allclose(y[..., 1, :], x[..., 1, :])
    assert torch.allclose(y.pow(2).sum(-1), x.pow(2).sum(-1), atol=1e-5)
    # causal: a later token does not change an earlier one's logits
    tokens = torch.randint(0, 256, (1, c.seq))
    changed = tokens.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 256
    assert torch.allclose(model(tokens)[0, :-1], model(changed)[0, :-1])
    # a stage keeps the whole model's names for its part
    stage = llama.Llama(c).keep_stage(1, 2)
    assert stage.tok_embeddings is None and set(stage.layers) == {"2", "3"} and stage.output is not None


def test_the_reference_run_learns_and_repeats(reference):
    assert reference == cap.reference(steps=STEPS)
    assert reference[-1] < reference[0] - 1.0  # from ~ln 256 = 5.5 down
    assert cap.tolerance(cap.RUN, 10) <= cap.TOLERANCE


@pytest.mark.parametrize("mesh, world, words", [((2, 2, 2), 4, "has 8 ranks, but 4"), ((1, 1, 8), 8, "tp=8"),
                                                ((1, 8, 1), 8, "pp=8"), ((8, 2, 1), 16, "dp=8")])
def test_a_mesh_that_cannot_run_is_refused_with_what_works(mesh, world, words):
    with pytest.raises(ConfigError, match=words) as err:
        cap.check_mesh(world, mesh)
    assert "Meshes (dp x pp x tp) that work" in str(err.value)


def test_a_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint"):
        ckpt.stored(str(tmp_path))
    with pytest.raises(ConfigError, match="no checkpoint"):
        ckpt.load(str(tmp_path), llama.Llama(), None)


# -- on the cluster ------------------------------------------------------------------------------------------------
def test_machine_peak_counts_the_cpu_budget_not_every_core(monkeypatch):
    monkeypatch.setenv("PPKIT_CPU_BUDGET", "0.001")  # a hub pod's quota, far below the machine's cores
    assert cs.machine_peak() < cs.machine_peak(1) / 10


def test_an_unknown_pipeline_schedule_is_refused():
    with pytest.raises(ConfigError, match="schedule='zigzag' is not one of gpipe, 1f1b"):
        cap.check_mesh(4, (1, 2, 2), cap.Run(schedule="zigzag"))


class _NoRanks:
    """A cluster of 8 whose ranks must not be reached: train_on refuses a bad mesh in the kernel."""
    world_size = 8

    def run(self, *args, **kwargs):
        raise AssertionError("a bad mesh reached the ranks")


@pytest.mark.parametrize("mesh, ranks, words", [((1, 1, 4), None, "ranks=8 of this cluster's 8"),
                                                ((2, 2, 2), 4, "has 8 ranks, but 4 run it.*ranks=4")])
def test_train_on_refuses_a_bad_mesh_once_in_the_kernel(mesh, ranks, words):
    with pytest.raises(ConfigError, match=words):
        cap.train_on(_NoRanks(), mesh, ranks=ranks, steps=1)
    with pytest.raises(ConfigError, match="world size 9"):
        cap.train_on(_NoRanks(), (1, 1, 1), ranks=9)


@pytest.mark.slow
def test_a_4_rank_dp2_tp2_run_equals_one_process(cluster8, reference, recorded):
    results = cap.train_on(cluster8, (2, 1, 2), steps=STEPS, ranks=4, metrics=True, parity=True)
    assert results[4:] == [None] * 4
    _within(cap.combine(results), reference)
    _same_gradients(recorded, results, list(range(STEPS)))
    # tensor parallel is really there: wq (64 x 64) is split by rows over tp, and again by FSDP2 over dp
    for r in results[:4]:
        assert r["layout"]["placements"]["tp"] == TP_ROWS and "Shard(dim=0" in r["layout"]["placements"]["dp"]
        assert r["layout"]["local"] == (16, 64)
    # every rank reported tokens/s each step, the ranks that hold a loss (all four: no pipeline) their loss
    rows = ppkit.metrics()
    assert sorted({(r["rank"], r["step"]) for r in rows}) == [(k, i) for k in range(4) for i in range(STEPS)]
    assert all(r["tokens_per_s"] > 0 and "loss" in r for r in rows)


@pytest.mark.slow
def test_an_8_rank_3d_run_equals_one_process(cluster8, reference, recorded):
    results = cap.train_on(cluster8, (2, 2, 2), steps=STEPS, parity=True)
    assert [r["coords"] for r in results] == [(i // 4, i // 2 % 2, i % 2) for i in range(8)]
    assert all((r["losses"][0] is None) == (r["coords"][1] == 0) for r in results)  # only the last stage has a loss
    _within(cap.combine(results), reference)
    # every gradient, gathered from its DTensor shards (FSDP2 over dp, TP over tp) and pipeline stages, by name
    report = _same_gradients(recorded, results, list(range(STEPS)))
    assert str(report).count("39 gradients") == 1  # 4 blocks x 9 tensors, embedding, norm, output
    # the tolerance tells runs apart: a learning rate 1 % higher is outside it (2e-3 after 4 steps, when written)
    other = cap.reference(cap.Run(lr=cap.RUN.lr * 1.01), steps=STEPS)
    assert max(abs(a - b) / abs(b) for a, b in zip(other, reference)) > 5 * cap.TOLERANCE


@pytest.mark.slow
def test_a_checkpoint_of_dp2_tp2_resumes_on_tp4_and_on_pp2_dp2(cluster8, reference, recorded, tmp_path):
    path = str(tmp_path / "step2")
    first = cap.run_mesh(cluster8, (2, 1, 2), steps=2, ranks=4, save=path)
    stored = ckpt.stored(path)
    assert sorted(stored.files) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]
    # a column-parallel weight (64 x 64): tp 2 splits its rows, FSDP2 over dp 2 splits them again: 4 chunks of 16
    wq = "model.layers.0.attention.wq.weight"
    assert stored.sizes[wq] == (64, 64)
    assert sorted(stored.chunks[wq]) == [((16 * i, 0), (16, 64)) for i in range(4)]
    assert "optim.state.layers.0.attention.wq.weight.exp_avg" in stored.chunks
    # resumed: losses and every gradient of steps 2-3 as one process's (the pipeline through 1F1B, the same math)
    for mesh, run in (((1, 1, 4), cap.RUN), ((2, 2, 1), cap.Run(schedule="1f1b"))):
        results = cap.train_on(cluster8, mesh, run, ranks=4, steps=STEPS - 2, start=2, load=path, parity=True)
        _within(first + cap.combine(results), reference)
        _same_gradients(recorded, results, list(range(2, STEPS)))
        layouts = [r["layout"] for r in results[:4]]
        if mesh == (1, 1, 4):  # tp 4 alone: 16 of wq's 64 rows on each rank
            assert all(w == {"placements": {"tp": TP_ROWS}, "local": (16, 64)} for w in layouts), layouts
        else:  # FSDP2 over dp 2 on each stage: 32 rows
            assert all(w == {"placements": {"dp": TP_ROWS}, "local": (32, 64)} for w in layouts), layouts


@pytest.mark.slow
def test_speed_counts_each_mesh(cluster8):
    (speed,) = cs.measure(cluster8, [(2, 1, 2)], peak_flops_per_s=1e9, steps=1, warmup=1)
    assert speed.mesh == (2, 1, 2) and speed.step_s > 0 and len(speed.losses) == 2
    assert speed.tokens_per_s == pytest.approx(cap.RUN.tokens / speed.step_s)
    assert speed.mfu == pytest.approx(cs.step_flops() / speed.step_s / 1e9)
    assert cs.step_flops() == (6 * llama.matmul_params(llama.Config()) + 12 * 4 * 32 * 64) * 256
    assert os.cpu_count() and cs.machine_peak(1) > 0
