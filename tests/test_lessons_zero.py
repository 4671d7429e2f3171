"""ZeRO by hand and FSDP2: the same weights as DDP, and exactly the bytes the code says it holds and sends."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import data_parallel as dp
from ppkit.lessons import fsdp2, zero

# the workers cannot import this test module: ship its functions by value, as a notebook's are
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NUMELS = [p.numel() for p in dp.make_model().parameters()]  # 64, 16, 48, 3
WEIGHTS = [p.numel() for p in dp.make_model().parameters() if p.dim() == 2]


def padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def expected(stage: int, n: int) -> dict:
    """What train() must measure, with each parameter padded to a multiple of n."""
    full, pad = sum(NUMELS), sum(padded(k, n) for k in NUMELS)
    held = {"params": 4 * (pad // n if stage == 3 else pad),
            "grads": 4 * (full if stage < 2 else pad // n),
            "optimizer": 8 * (full if stage == 0 else pad // n)}
    ring = (n - 1) / n
    sent = {0: 2 * ring * 4 * full, 1: 2 * ring * 4 * pad, 2: 2 * ring * 4 * pad,
            # forward gathers weights and biases, backward gathers weights only, then reduce-scatters both
            3: ring * 4 * (2 * pad + sum(padded(k, n) for k in WEIGHTS))}[stage]
    return {"held": held, "sent_bytes": sent}


def test_formulas_are_the_zero_papers():
    assert zero.num_params() == 131
    assert zero.memory_formula(100, 4, 0) == {"params": 400, "grads": 400, "optimizer": 800}
    assert zero.memory_formula(100, 4, 1) == {"params": 400, "grads": 400, "optimizer": 200}
    assert zero.memory_formula(100, 4, 2) == {"params": 400, "grads": 100, "optimizer": 200}
    assert zero.memory_formula(100, 4, 3) == {"params": 100, "grads": 100, "optimizer": 200}
    assert zero.comm_formula(100, 4, 1) == zero.comm_formula(100, 4, 0) == 600
    assert zero.comm_formula(100, 4, 3) == 900


def test_an_unknown_stage_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"ZeRO stage 4 does not exist: pick one of \(0, 1, 2, 3\)"):
        zero.memory_formula(10, 2, 4)


def test_padding_and_slices():
    t = torch.arange(5.0)
    flat = zero.padded_flat(t, 4)
    assert flat.tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    assert zero.my_slice(flat, 2, 4).tolist() == [4, 0]
    assert zero.unflatten(flat, t).tolist() == t.tolist()


@pytest.mark.slow
@pytest.mark.parametrize("cluster_name", ["cluster2", "cluster4"])
def test_every_stage_ends_with_ddps_weights_and_measures_what_it_holds(cluster_name, request):
    cluster = request.getfixturevalue(cluster_name)
    n = cluster.world_size
    ddp = cluster.run(zero.ddp_train, steps=3)
    for stage in zero.STAGES:
        results = cluster.run(zero.train, stage=stage, steps=3)
        want = expected(stage, n)
        for rank, r in enumerate(results):
            assert zero.max_difference(r["params"], ddp[rank]) < 1e-6, (stage, rank)
            assert r["held"] == want["held"], (stage, rank)
            assert r["sent_bytes"] == pytest.approx(want["sent_bytes"]), (stage, rank)
        assert len({tuple(r["losses"]) for r in results}) == n  # each rank trained on its own samples


def test_ddp_weights_move_so_the_equality_is_not_trivial(cluster2):
    after = cluster2.run(zero.ddp_train, steps=3)[0]
    before = dict(dp.make_model().named_parameters())
    assert zero.max_difference(after, {k: v.detach() for k, v in before.items()}) > 1e-3


def test_stage_collectives_are_the_ones_the_lesson_names(cluster2):
    calls = {s: [name for name, _ in cluster2.run(zero.train, stage=s, steps=1)[0]["calls"]]
             for s in zero.STAGES}
    assert calls[0] == ["all_reduce"] * 4
    assert calls[1] == ["reduce_scatter"] * 4 + ["all_gather"] * 4
    assert calls[2] == calls[1]  # the same calls; stage 2 makes the reduce_scatters during backward
    assert calls[3].count("all_gather") == 6 and calls[3].count("reduce_scatter") == 4


def test_fsdp2_equals_ddp_and_holds_its_dim0_shards(cluster2):
    ddp = cluster2.run(zero.ddp_train, steps=3)
    results = cluster2.run(fsdp2.train, steps=3)
    for rank, r in enumerate(results):
        assert zero.max_difference(r["params"], ddp[rank]) < 1e-6
        assert r["counts"] == {"all_gather": 4, "reduce_scatter": 2}
    # torch.chunk on dim 0: 16 rows -> 8 + 8, 3 rows -> 2 + 1
    assert results[0]["shapes"] == {"0.weight": (8, 4), "0.bias": (8,), "2.weight": (2, 16), "2.bias": (2,)}
    assert results[1]["shapes"]["2.weight"] == (1, 16)
    for r in results:
        local = sum(torch.Size(s).numel() for s in r["shapes"].values())
        assert r["held"] == {"params": 4 * local, "grads": 4 * local, "optimizer": 8 * local}


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, pinned memory is available and this works")
def test_cpu_offload_with_default_pinning_fails_without_cuda(cluster2):
    with pytest.raises(ppkit.RemoteError) as info:
        cluster2.run(fsdp2.cpu_offload_default)
    assert set(info.value.exc_types.values()) == {"RuntimeError"}
    assert "Found no NVIDIA driver" in info.value.tracebacks[0]
    assert "pin_memory" in info.value.tracebacks[0] or "pin" in info.value.tracebacks[0]


def test_cpu_offload_without_pinning_runs(cluster2):
    losses = cluster2.run(fsdp2.cpu_offload_unpinned)
    assert losses[0] == pytest.approx(losses[1]) and losses[0] > 0


def _bf16_and_hybrid(rank, world_size):
    """What notebook 09 says runs on CPU/gloo besides plain fully_shard: bf16 mixed precision, and
    hybrid sharding on a 2 x 2 mesh (replicate over one dimension, shard over the other)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    x, y = dp.make_batch(8)
    out = {}
    model = dp.make_model()
    fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)),
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    logits = model(x)
    F.cross_entropy(logits.float(), y).backward()
    out["bf16_logits"] = logits.dtype
    model = dp.make_model()
    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh)
    F.cross_entropy(model(x), y).backward()
    out["hybrid_local_weight"] = tuple(model[0].weight.to_local().shape)
    out["hybrid_grad"] = model[0].weight.grad.full_tensor()
    return out


@pytest.mark.slow
def test_fsdp2_mixed_precision_and_hybrid_sharding_run_on_cpu(cluster4):
    results = cluster4.run(_bf16_and_hybrid)
    assert all(r["bf16_logits"] == torch.bfloat16 for r in results)
    assert all(r["hybrid_local_weight"] == (8, 4) for r in results)  # 16 rows sharded over 2
    whole = dp.make_model()
    x, y = dp.make_batch(8)
    torch.nn.functional.cross_entropy(whole(x), y).backward()
    for r in results:  # every rank ran the same batch: the averaged gradient is the one-process gradient
        assert torch.allclose(r["hybrid_grad"], whole[0].weight.grad, atol=1e-6)
