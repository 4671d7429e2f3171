"""Expert parallelism by hand equals the one-process MoE layer on the same tokens, outputs and gradients;
only the counted pairs travel; the differentiable all_to_all with uneven splits matches torch's on gloo;
the comparison fails on a wrong layer; bad settings are refused and leave the cluster usable."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import expert_parallel as ep
from ppkit.lessons import moe

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SETTINGS = [
    {},                                                        # 8 experts, top-2, capacity 1.25: a few drops
    {"top_k": 1, "capacity_factor": 0.5, "skew": 2.0},         # many drops, skewed
    {"experts": 12, "top_k": 3, "tokens": 48, "skew": 1.0},    # 3 experts per rank on 4, 6 on 2
    {"experts": 4, "top_k": 4, "capacity_factor": 4.0},        # every token to every expert, nothing dropped
    {"skew": 10.0, "capacity_factor": 4.0},                    # all to experts 0 and 1: ranks that get no row
]
ERRORS = {"forward", "aux", "d_tokens", "d_router", "d_w1", "d_w2"}
TORCH_214 = pytest.mark.skipif(not torch.__version__.startswith("2.14."),
                               reason="notebook 12 describes torch 2.14's all_to_all functions")


@pytest.mark.slow
@pytest.mark.parametrize("cluster_name", ["cluster2", "cluster4"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_expert_parallel_equals_one_process_forward_and_backward(cluster_name, dtype, request):
    cluster = request.getfixturevalue(cluster_name)
    for options in SETTINGS:
        s = moe.settings(dtype=dtype, **options)
        per_rank = cluster.run(ep.compare, dtype=dtype, **options)
        for rank, result in enumerate(per_rank):
            assert result["same_routing"], (options, rank)
            assert max(result[k] for k in ERRORS) < ep.TOLERANCE[dtype], (options, rank, result)
            # a rank sends its kept pairs' rows (dispatch) and their gradients (combine's backward), and the
            # rows its experts computed (combine) and their gradients (dispatch's backward); nothing else
            row = s.hidden * (4 if dtype == "float32" else 8)
            assert result["bytes"] == 2 * (result["kept_pairs"] + result["rows_computed"]) * row
        assert sum(r["kept_pairs"] for r in per_rank) == sum(r["rows_computed"] for r in per_rank)


def test_drops_are_counted_and_skew_empties_some_ranks(cluster4):
    skewed = cluster4.run(ep.compare, skew=10.0, capacity_factor=4.0)
    assert all(r["dropped_pairs"] == 0 for r in skewed)
    squeezed = cluster4.run(ep.compare, top_k=1, capacity_factor=0.5, skew=2.0)
    assert all(r["dropped_pairs"] > 0 for r in squeezed)


def _logged_all_to_all(rank, world_size):
    input_splits = [(rank + 2 * q) % 3 for q in range(world_size)]  # zeros included
    output_splits = [(q + 2 * rank) % 3 for q in range(world_size)]
    x = torch.randn(sum(input_splits), 5).requires_grad_()
    log = ep.AllToAllLog()
    ep.AllToAll.apply(x, output_splits, input_splits, None, log, "dispatch").sum().backward()
    row = 5 * 4
    return ([(c["direction"], c["rows"], c["bytes"], c["off_rank"]) for c in log.calls],
            [("forward", sum(input_splits), sum(input_splits) * row, (sum(input_splits) - input_splits[rank]) * row),
             ("backward", sum(output_splits), sum(output_splits) * row,
              (sum(output_splits) - output_splits[rank]) * row)])


@pytest.mark.slow
def test_uneven_all_to_all_and_its_backward_equal_torchs_on_gloo(cluster4):
    for found in cluster4.run(ep.against_torch):
        assert {name: f["equal"] for name, f in found.items()} == {
            "torch.distributed.nn.functional.all_to_all_single": True,
            "torch.distributed._functional_collectives.all_to_all_single_autograd": True}
    for got, want in cluster4.run(_logged_all_to_all):
        assert got == want


@pytest.mark.slow
@TORCH_214
def test_torchs_first_all_to_all_is_deprecated_as_the_notebook_says(cluster2):
    found = cluster2.run(ep.against_torch)[0]
    assert found["torch.distributed.nn.functional.all_to_all_single"]["warnings"] == [
        "FutureWarning: torch.distributed.nn.functional.all_to_all_single is deprecated, use "
        "torch.distributed._functional_collectives.all_to_all_single instead."]
    assert found["torch.distributed._functional_collectives.all_to_all_single_autograd"]["warnings"] == []


def _rows_taken_in_expert_order(rows, received, w1, w2, timeline):
    """A plausible mistake: rows arrive grouped by source rank, then by expert, not by expert."""
    chunks = rows.split(received.sum(0).tolist())
    return torch.cat([moe.expert_mlp(c, w1[j], w2[j]) for j, c in enumerate(chunks)])


def _compare_with(patch, **options):
    def job(rank, world_size):
        saved = {name: getattr(ep, name) for name in patch}
        try:
            for name, value in patch.items():
                setattr(ep, name, value)
            return ep.compare(rank, world_size, **options)
        finally:
            for name, value in saved.items():
                setattr(ep, name, value)
    return job


def _gates_as_constants(x, router, s):
    r = moe.route(x, router, s)
    r.gates = r.gates.detach()
    return r


def test_the_comparison_fails_on_a_wrong_layer(cluster4):
    mixed_up = cluster4.run(_compare_with({"_local_experts": _rows_taken_in_expert_order}, experts=8))
    assert max(r["forward"] for r in mixed_up) > 1e-2
    constant_gates = cluster4.run(_compare_with({"route": _gates_as_constants}))
    assert max(r["d_router"] for r in constant_gates) > 1e-2 and max(r["forward"] for r in constant_gates) < 1e-5


def _whole_layer_on_one_rank(rank, world_size):
    s = moe.settings()
    ep.ep_moe_layer(moe.tokens(s, rank)[0], moe.parameters(s), s)


def test_settings_refused_on_the_ranks_leave_the_cluster_usable(cluster4):
    with pytest.raises(ppkit.RemoteError, match="6 experts cannot be spread evenly over 4 ranks; pick a number of "
                                                r"experts that is a multiple of 4 \(such as 4 or 8\)"):
        cluster4.run(ep.compare, experts=6)
    with pytest.raises(ppkit.RemoteError, match="top_k=9: each token picks top_k different experts out of 8"):
        cluster4.run(ep.compare, top_k=9)
    with pytest.raises(ppkit.RemoteError, match="capacity_factor=0: it must be a finite number above 0"):
        cluster4.run(ep.compare, capacity_factor=0)
    with pytest.raises(ppkit.RemoteError, match="this rank holds the weights of 8 experts, but 8 experts over 4 "
                                                r"ranks is 2 each: pass parameters\(s\).local\(rank, 4, s\)"):
        cluster4.run(_whole_layer_on_one_rank)
    assert cluster4.state == "ready"
    assert max(cluster4.run(ep.compare)[0][k] for k in ERRORS) < 1e-5


def test_dispatch_splits_of_the_lesson(cluster2):
    def job(rank, world_size):
        counts = torch.tensor([[1, 0, 2, 3], [0, 0, 4, 5]][rank])
        return ep.dispatch_splits(counts, world_size), ep.exchange_counts(counts).tolist()

    (splits0, got0), (splits1, got1) = cluster2.run(job)
    assert splits0 == ([1, 5], [1, 0]) and splits1 == ([0, 9], [5, 9])
    assert got0 == [[1, 0], [0, 0]] and got1 == [[2, 3], [4, 5]]  # row q: what rank q sends my experts


def test_bad_parameters_refused_in_one_process():
    s = moe.settings(experts=4)
    with pytest.raises(ConfigError, match="4 experts cannot be spread evenly over 3 ranks"):
        moe.parameters(s).local(0, 3, s)


def _counts_that_cannot_be_shared(rank, world_size):
    return ep.dispatch_splits(torch.ones(5, dtype=torch.int64), world_size)


def test_counts_the_ranks_cannot_share_are_refused(cluster2):
    with pytest.raises(ppkit.RemoteError, match=r"tokens_per_expert has shape \(5,\): it needs one count per expert, "
                                                "and the experts spread evenly over the 2 ranks"):
        cluster2.run(_counts_that_cannot_be_shared)
    assert cluster2.state == "ready"
