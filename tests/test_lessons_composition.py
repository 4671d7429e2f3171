"""Lesson 13: one step of the transformer on a 3-D mesh (TP by DTensor, GPipe stages, FSDP2 over dp) equals the
one-process step; what each rank holds (model state, activations) and sends is measured and set beside the formulas;
bad meshes are refused."""

from __future__ import annotations

import pytest
import torch

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import composition as comp
from ppkit.lessons import composition_measure as cm
from ppkit.lessons import mesh_costs as mc
from ppkit.lessons import sequence_parallel as sp
from ppkit.lessons import sequence_parallel_torch as spt

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def cluster8():
    with ppkit.Cluster(8, "gloo", timeout=300) as cluster:
        yield cluster


@pytest.mark.slow
def test_the_3d_step_equals_one_process(cluster8):
    m = mc.measure(cluster8, (2, 2, 2))
    assert m.equal and m.grad_error < cm.TOLERANCE, (m.loss, m.reference_loss, m.grad_error)
    # every parameter of the model is compared on some rank: stage 0 and stage 1 together hold all of them
    names = {n for n, _ in comp.Transformer().named_parameters()}
    assert sum(r.compared for r in m.ranks if r.coords[0] == 0 and r.coords[2] == 0) == len(names)
    assert [r.coords for r in m.ranks] == [(i // 4, i // 2 % 2, i % 2) for i in range(8)]
    # each rank holds its shards: weight, gradient and Adam's two moments of the same shape
    for r in m.ranks:
        assert r.held["grads"] == r.held["params"] and r.held["optimizer"] == 2 * r.held["params"]
    # activations: what the formula says each stage keeps (stated tolerance: none, every tensor is accounted for)
    assert m.activations() == [mc.activations_formula((2, 2, 2), stage=r.coords[1]) for r in m.ranks]
    assert m.memory() == [s + a for s, a in zip(m.model_state(), m.activations())]
    assert m.model_state() == [r.held["params"] + r.held["grads"] + r.held["optimizer"] for r in m.ranks]
    # traffic: FSDP2 over dp, sends over pp, all_reduces over tp (6 per block and micro-batch: q, k, v separate)
    first = m.ranks[0].calls
    assert set(first["dp"]) == {"all_gather", "reduce_scatter"} and first["tp"] == {"all_reduce": 24}
    assert first["pp"]["send"] >= 2 and m.sent("tp") == 24 * 2 * (1 / 2) * 4 * 2 * 8 * 16
    assert m.sent("pp") >= 2 * 4 * 2 * 8 * 16


@pytest.mark.slow
def test_replicas_over_dp_equal_one_process_and_hold_more(cluster8):
    m = mc.measure(cluster8, (2, 2, 2), shard_dp=False)
    assert m.equal, (m.loss, m.reference_loss, m.grad_error)
    assert set(m.ranks[0].calls["dp"]) == {"all_reduce"}
    sharded = mc.memory_formula((2, 2, 2))
    assert mc.memory_formula((2, 2, 2), shard_dp=False) == 2 * sharded
    assert min(m.model_state()) > 2 * sharded  # plus the norms and biases that tp keeps whole
    # FSDP2's sharding leaves the activations as they are: the same bytes as with shards
    assert m.activations() == mc.measure(cluster8, (2, 2, 2)).activations()


@pytest.mark.slow
def test_activations_per_rank_against_one_process(cluster8):
    """dp halves the sequences per rank, pp gives each stage its blocks (all GPipe micro-batches kept), tp
    splits what layer_activations says it splits; without tp each block keeps half of one process's."""
    ref = cm.reference_activations()
    for mesh in ((2, 4, 1), (1, 2, 4)):
        m = mc.measure(cluster8, mesh)
        for r in m.ranks:
            assert r.held["activations"] == mc.activations_formula(mesh, stage=r.coords[1]), (mesh, r.rank)
            blocks = {k: v for k, v in r.kept.items() if k.startswith("layer")}
            assert len(blocks) == 4 // mesh[1]
            b = comp.SIZE.batch // mesh[0]
            for name, kept in blocks.items():
                assert kept == mc.layer_activations(comp.SIZE, b, mesh[2]), (mesh, r.rank, name)
                if mesh[2] == 1:
                    assert kept * mesh[0] == ref[name]
        if mesh[2] > 1:  # tp=4 keeps less per block than one process's share of the batch would, but not 1/4
            per_block = ref["layer 0"] // mesh[0]
            assert per_block / 4 < mc.layer_activations(comp.SIZE, comp.SIZE.batch // mesh[0], 4) < per_block


def _without_dp_average(rank, world_size):
    """The comparison can fail: replicas whose gradients are never all_reduced over dp each have only their
    half of the batch's gradient."""
    mesh3d = comp.device_mesh((2, 2, 2))
    stage = comp.build_stage(mesh3d, shard_dp=False)
    comp._forward_backward(mesh3d, stage, comp.Size())
    grads = {n: cm._full(p.grad) for n, p in stage.named_parameters()}
    _, ref = comp.reference_step()
    return cm._error(grads, {n: p.grad for n, p in ref.named_parameters() if n in grads})


def test_a_mesh_on_the_first_ranks_of_the_cluster(cluster8):
    m = mc.measure(cluster8, (1, 2, 2), world_size=4)
    assert m.equal and [r.rank for r in m.ranks] == [0, 1, 2, 3]
    assert [r.coords for r in m.ranks] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    for bad in (0, 9, 2.0):
        with pytest.raises(ConfigError, match=rf"world size {bad!r}: .* this cluster, which has 8; pick a whole "
                                              r"number from 1 to 8"):
            mc.measure(cluster8, (1, 2, 2), world_size=bad)
    with pytest.raises(ConfigError, match=r"Meshes \(dp x pp x tp\) that work for 3 ranks: none\."):
        mc.measure(cluster8, (1, 1, 3), world_size=3)


@pytest.mark.slow
def test_a_step_that_skips_the_dp_average_is_caught(cluster8):
    assert min(cluster8.run(_without_dp_average)) > 1e-2


def test_bad_meshes_are_refused_and_the_cluster_stays_usable(cluster8):
    with pytest.raises(ConfigError, match=r"mesh 2x2x4 has 16 ranks, but the world has 8.*Meshes .* for 8 ranks: "
                                          r"1x2x4, 1x4x2, 2x1x4, 2x2x2, 2x4x1, 4x1x2, 4x2x1\."):
        mc.measure(cluster8, (2, 2, 4))
    with pytest.raises(ConfigError, match="pp=8 cannot split the 4 blocks evenly"):
        mc.measure(cluster8, (1, 8, 1))
    with pytest.raises(ConfigError, match="tp=8 cannot split 4 heads"):
        mc.measure(cluster8, (1, 1, 8))
    with pytest.raises(ConfigError, match="dp=8 cannot split a batch of 8 sequences into 2 micro-batches"):
        mc.measure(cluster8, (8, 1, 1))
    with pytest.raises(ConfigError, match="three whole numbers"):
        comp.check_mesh(8, (2, 4))
    with pytest.raises(ConfigError, match="at least 1"):
        comp.check_mesh(8, (-2, -4, 1))
    assert cluster8.state == "ready"
    assert cluster8.run(lambda rank, world_size: rank) == list(range(8))


def test_shapes_and_formulas():
    assert comp.shapes(8) == [(1, 2, 4), (1, 4, 2), (2, 1, 4), (2, 2, 2), (2, 4, 1), (4, 1, 2), (4, 2, 1)]
    size = comp.Size()
    assert size.params() == sum(p.numel() for p in comp.Transformer(size).parameters()) == 14_208
    assert mc.memory_formula((2, 2, 2)) == 16 * 14_208 / 8
    assert mc.memory_formula((4, 2, 1), shard_dp=False) == 16 * 14_208 / 2
    f = mc.comm_formula((2, 2, 2))
    activation = 4 * 2 * 8 * 16  # a micro-batch of 2 sequences x 8 tokens x d_model 16, fp32
    assert f == {"dp": 3 * 0.5 * 4 * 14_208 / 4, "pp": 2 * activation, "tp": 4 * 2 * 2 * 2 * 0.5 * activation}
    assert mc.comm_formula((1, 1, 1)) == {"dp": 0.0, "pp": 0.0, "tp": 0.0}
    for mesh, total, ok in mc.budget_table(8, 100_000, shard_dp=False):
        assert total == mc.memory_formula(mesh, shard_dp=False) + mc.activations_formula(mesh)
        assert ok == (total <= 100_000)


def test_activation_formula_against_one_process_and_lesson_10():
    size, ref = comp.SIZE, cm.reference_activations()
    # one process: every block keeps the same, and the whole equals the formula for a mesh of one rank
    assert {ref[f"layer {i}"] for i in range(4)} == {mc.layer_activations(size, size.batch, 1)}
    assert sum(ref.values()) == mc.activations_formula((1, 1, 1))
    # lesson 10's TP breakdown of the same block (an MLP of 4 h): the same bytes for every tp degree
    for tp in (1, 2, 4):
        block = sp.Size(d_model=size.d_model, hidden=size.ffn, heads=size.heads, batch=4, seq=size.seq)
        assert mc.layer_activations(size, 4, tp) == spt.kept_tp(block, tp)
    # GPipe keeps every micro-batch: the middle stages of 1x4x2 keep one block of all 8 sequences
    assert mc.activations_formula((1, 4, 2), stage=1) == mc.layer_activations(size, 8, 2)
    assert mc.activations_formula((1, 4, 2)) == mc.activations_formula((1, 4, 2), stage=3) > \
        mc.activations_formula((1, 4, 2), stage=0)


def test_wire_bytes_of_ring_algorithms():
    t = torch.zeros(10)  # 40 bytes
    assert cm.wire_bytes("c10d.allreduce_", [t], 4) == 2 * 3 / 4 * 40
    assert cm.wire_bytes("_c10d_functional.all_reduce", [t], 2) == 40
    assert cm.wire_bytes("c10d._allgather_base_", [torch.zeros(40), t], 4) == 3 * 40
    assert cm.wire_bytes("c10d._reduce_scatter_base_", [t, torch.zeros(40)], 4) == 3 / 4 * 160
    assert cm.wire_bytes("c10d.send", [t], 2) == 40 and cm.wire_bytes("c10d.recv_", [t], 2) == 0
    with pytest.raises(ValueError, match="no wire model for c10d.broadcast_"):
        cm.wire_bytes("c10d.broadcast_", [t], 2)


def test_a_stage_keeps_the_whole_models_names():
    names = [n for n, _ in comp.Transformer().keep_stage(1, 2).named_parameters()]
    assert names[0].startswith("layers.2.") and names[-1] == "head.bias" and not any("embed" in n for n in names)
    assert [n for n, _ in comp.Transformer().keep_stage(0, 4).named_parameters()][0] == "embed.weight"
