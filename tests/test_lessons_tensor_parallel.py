"""Tensor parallel layers by hand equal the unsplit ones forward and backward, and so does DTensor's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import tensor_parallel as tp

BLOCKS = ("column", "row", "mlp", "attention")
EXPECTED_CALLS = {"column": [("column", "backward")], "row": [("row", "forward")],
                  "mlp": [("fc2", "forward"), ("fc1", "backward")],
                  "attention": [("o", "forward"), ("qkv", "backward")]}


@pytest.mark.slow
@pytest.mark.parametrize("cluster_name", ["cluster2", "cluster4"])
def test_each_split_equals_the_unsplit_module(cluster_name, request):
    cluster = request.getfixturevalue(cluster_name)
    n = cluster.world_size
    for block in BLOCKS:
        for rank, r in enumerate(cluster.run(tp.compare, block=block)):
            assert r["forward"] < 1e-5 and r["input_grad"] < 1e-5 and r["param_grads"] < 1e-5, (block, rank, r)
            assert [(w, d) for w, d, _ in r["all_reduces"]] == EXPECTED_CALLS[block], (block, r)
            formula = tp.comm_formula(block, n)
            assert all(size == formula["bytes_each"] for _, _, size in r["all_reduces"])
            assert len(r["all_reduces"]) == formula["all_reduces"]


def test_mlp_weights_per_rank_match_the_formula(cluster4):
    for r in cluster4.run(tp.compare, block="mlp"):
        assert r["param_bytes"] == tp.mlp_memory_formula(4)["weights"]


def test_a_split_that_drops_the_all_reduce_is_caught(cluster2):
    """The comparison can fail: a row-parallel layer without its all_reduce gives a partial sum."""
    def partial_only(rank, world_size):
        torch.manual_seed(0)
        full = nn.Linear(tp.D_MODEL, tp.D_MODEL)
        row = tp.RowParallelLinear(full, rank, world_size, tp.AllReduceLog())
        x, _ = tp._inputs()
        cols = tp.part(tp.D_MODEL, rank, world_size, "x")
        return float((nn.functional.linear(x[..., cols], row.weight) + row.bias - full(x)).abs().max())
    assert min(cluster2.run(partial_only)) > 1e-2


def test_an_uneven_split_says_what_divides():
    with pytest.raises(ConfigError, match="3 ranks cannot split evenly; pick a tensor-parallel degree that divides 8"):
        tp.ColumnParallelLinear(nn.Linear(4, 8), 0, 3, tp.AllReduceLog(), "fc1")
    with pytest.raises(ConfigError, match="no block 'conv'"):
        tp.compare(0, 2, block="conv")


@pytest.mark.slow
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_dtensor_parallelize_module_equals_the_hand_version(cluster2, block):
    for r in cluster2.run(tp.dtensor_compare, block=block):
        assert r["forward"] < 1e-5 and r["input_grad"] < 1e-5 and r["weight_shards"] == 0
        if block == "mlp":  # the same two all_reduces as by hand: fc2 forward, fc1 backward
            assert r["per_layer"] == {"fc1": {"forward": 0, "backward": 1}, "fc2": {"forward": 1, "backward": 0}}
        else:  # one per projection backward: torch has no fused qkv here, the hand version has one
            assert r["per_layer"] == {"q": {"forward": 0, "backward": 1}, "k": {"forward": 0, "backward": 1},
                                      "v": {"forward": 0, "backward": 1}, "o": {"forward": 1, "backward": 0}}
            assert r["total"] == 4


def test_uneven_heads_fail_on_the_ranks(cluster4):
    def three_heads(rank, world_size):
        tp.ParallelAttention(tp.Attention(d_model=6, heads=3), rank, world_size, tp.AllReduceLog())
    with pytest.raises(ppkit.RemoteError, match="the heads has 3 features"):
        cluster4.run(three_heads)
