"""Lesson 10's sequence parallelism: TP and TP + SP blocks by hand and torch's SequenceParallel plan equal the unsplit
block forward and backward; SP sends TP's bytes and keeps what the breakdown says per rank; the exercise's checker."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from ppkit.errors import ConfigError, ExerciseFailed
from ppkit.exercises import check_sequence
from ppkit.lessons import sequence_parallel as sp
from ppkit.lessons import sequence_parallel_torch as spt
from ppkit.lessons import step_memory as sm

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module

pytestmark = pytest.mark.timeout(600)


def _equal(per_rank, keys=("forward", "input_grad", "param_grads")) -> bool:
    return all(r[k] < 1e-5 for r in per_rank for k in keys)


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["cluster2", "cluster4"])
def test_tp_and_sp_blocks_equal_the_unsplit_block_and_send_the_same_bytes(fixture, request):
    cluster = request.getfixturevalue(fixture)
    n = cluster.world_size
    tp_ranks, sp_ranks = (cluster.run(sp.compare, mode=mode) for mode in ("tp", "sp"))
    assert _equal(tp_ranks) and _equal(sp_ranks)
    activation = sp.SMALL.batch * sp.SMALL.seq * sp.SMALL.d_model * 4  # one (b, s, h) fp32 tensor
    assert [c[1] for c in tp_ranks[0]["calls"]] == ["all_reduce"] * 4
    assert sorted(c[1] for c in sp_ranks[0]["calls"]) == ["all_gather"] * 4 + ["reduce_scatter"] * 4
    assert tp_ranks[0]["sent"] == sp_ranks[0]["sent"] == 4 * 2 * (n - 1) / n * activation


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["cluster2", "cluster4"])
def test_activations_kept_per_rank_are_the_breakdowns(fixture, request):
    cluster = request.getfixturevalue(fixture)
    t, size = cluster.world_size, sp.MEASURED
    for mode, formula in (("tp", spt.kept_tp), ("sp", spt.kept_sp)):
        kept = {r["activation_bytes"] for r in cluster.run(sp.compare, mode=mode, size=size)}
        assert kept == {formula(size, t)}, mode
    whole = sp.Block(size)
    with sm.SavedTensors(whole) as saved:
        whole(torch.randn(size.batch, size.seq, size.d_model, requires_grad=True))
    assert saved.total() == spt.kept_tp(size, 1) == spt.kept_sp(size, 1)
    assert spt.kept_sp(size, t) < spt.kept_tp(size, t)


def test_the_playbooks_tp_and_sp_formulas_meet_at_one_rank():
    s, b, h, a = 4096, 1, 4096, 32
    assert spt.playbook_tp(s, b, h, a, 1) == pytest.approx(spt.playbook_sp(s, b, h, a, 1))
    assert spt.playbook_sp(s, b, h, a, 1) == pytest.approx(sm.playbook_activations(s, b, h, a))
    # TP keeps 10 sbh whole whatever t; SP divides everything by t
    assert spt.playbook_tp(s, b, h, a, 8) - spt.playbook_sp(s, b, h, a, 8) == pytest.approx(s * b * h * 10 * 7 / 8)


@pytest.mark.slow
def test_torchs_sequence_parallel_plan_equals_the_hand_version(cluster2):
    for size in (sp.SMALL, sp.MEASURED):
        ranks = cluster2.run(spt.dtensor_compare, size=size)
        assert _equal(ranks)
        assert ranks[0]["collectives"] == {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 4}
        assert all(r["activation_bytes"] == r["hand_activation_bytes"] == spt.kept_sp(size, 2) for r in ranks)


def test_sizes_the_ranks_cannot_split_are_refused():
    with pytest.raises(ConfigError, match="3 ranks cannot split a sequence of 8 tokens, 4 heads and 32 hidden"):
        sp.check_size(sp.SMALL, 3)


def test_the_gather_and_scatter_are_each_others_halves(cluster2):
    def job(rank, world_size):
        full = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3) * (rank + 1)
        shard = sp.scatter_sequence(full)      # my tokens of the sum over ranks: 1x + 2x = 3x
        return shard, sp.gather_sequence(shard)

    base = torch.arange(24, dtype=torch.float32).view(2, 4, 3)
    for rank, (shard, gathered) in enumerate(cluster2.run(job)):
        assert torch.equal(shard, 3 * base[:, 2 * rank:2 * rank + 2]) and torch.equal(gathered, 3 * base)


def everything(partial):
    dist.all_reduce(partial)
    return partial


@pytest.mark.slow
def test_the_checker_says_an_all_reduce_gives_every_token(bare6):
    with pytest.raises(ExerciseFailed, match="rank 0 of 2 returned all 12 tokens of the sum: that is TP's all_reduce"):
        check_sequence.check_sequence_shard_of_sum(everything, cluster=bare6)
