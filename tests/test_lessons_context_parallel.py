"""Ring attention by hand equals torch's attention in one process, forward and backward; the layouts
cut the sequence as drawn; bad settings are refused with what would work; torch's own version is
described as it behaves on CPU."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import context_parallel as cp
from ppkit.lessons import ring_attention as ra

cloudpickle.register_pickle_by_value(sys.modules[__name__])

CASES = [(s, c) for s in cp.SHARDINGS for c in (False, True)]


@pytest.mark.slow
@pytest.mark.parametrize("cluster_name", ["cluster2", "cluster4"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ring_attention_equals_full_attention_forward_and_backward(cluster_name, dtype, request):
    cluster = request.getfixturevalue(cluster_name)
    for sharding, causal in CASES:
        for rank, errors in enumerate(cluster.run(cp.compare, seq_len=64, sharding=sharding, causal=causal,
                                                  dtype=dtype)):
            assert set(errors) == {"forward", "dq", "dk", "dv"}
            assert max(errors.values()) < cp.TOLERANCE[dtype], (sharding, causal, rank, errors)


def test_uneven_head_dim_and_more_heads(cluster2):
    for errors in cluster2.run(cp.compare, seq_len=40, sharding="zigzag", causal=True, heads=3, head_dim=5):
        assert max(errors.values()) < cp.TOLERANCE["float32"]


def average(out_a, lse_a, out_b, lse_b):
    return (out_a + out_b) / 2, torch.logaddexp(lse_a, lse_b)


def test_a_wrong_merge_is_caught(cluster2):
    """The comparison can fail: averaging the partial results instead of weighting them."""
    for errors in cluster2.run(cp.compare, seq_len=32, merge_fn=average):
        assert errors["forward"] > 1e-2 and errors["dq"] > 1e-3  # dK, dV need only the lse, which is right


class DropsGradients(ra.Ring):
    """A ring whose dK/dV never arrive: the blocks' gradients stay with the last rank that added."""

    def start(self, tensor, tag):
        if tag == ra.GRAD_TAG:
            return torch.zeros_like(tensor)
        return super().start(tensor, tag)

    @staticmethod
    def wait(pending):
        return pending if isinstance(pending, torch.Tensor) else ra.Ring.wait(pending)


def _without_the_reverse_ring(rank, world_size):
    lay = cp.layout(32, world_size, "zigzag")
    q, k, v, up = cp.inputs(32)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    (F.scaled_dot_product_attention(*full, is_causal=True) * up).sum().backward()
    mine = [lay.shard(t, rank).requires_grad_() for t in (q, k, v)]
    out = ra.ring_attention(*mine, lay, True, ring=DropsGradients())
    (out * lay.shard(up, rank)).sum().backward()
    return [float((m.grad - lay.shard(f.grad, rank)).abs().max()) for m, f in zip(mine, full)]


def test_a_backward_that_drops_dk_dv_is_caught(cluster2):
    for dq, dk, dv in cluster2.run(_without_the_reverse_ring):
        assert dq < 1e-5 and dk > 1e-2 and dv > 1e-2


def test_merge_and_block_attention_in_one_process():
    q, k, v, _ = cp.inputs(24, dtype="float64")
    a, b = ra.block_attention(q, k[:, :, :7], v[:, :, :7]), ra.block_attention(q, k[:, :, 7:], v[:, :, 7:])
    out, lse = ra.merge(*a, *b)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12)
    scores = q @ k.transpose(-2, -1) / 4
    assert torch.allclose(lse, scores.logsumexp(-1), atol=1e-12)
    diag_out, _ = ra.block_attention(q, k, v, diagonal=True)
    assert torch.allclose(diag_out, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-12)


# -- layouts -------------------------------------------------------------------------------------

def test_layouts_cut_the_sequence_as_drawn():
    zig = cp.layout(16, 4, "zigzag")
    assert [zig.chunks(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert zig.positions(1).tolist() == [2, 3, 12, 13]
    line = cp.layout(16, 4, "contiguous")
    assert line.positions(3).tolist() == [12, 13, 14, 15]
    full = torch.arange(2 * 16.0).view(1, 2, 16, 1)
    for lay in (zig, line):
        assert torch.equal(lay.unshard([lay.shard(full, r) for r in range(4)]), full)


def test_work_per_rank_counted():
    assert cp.work_formula(cp.layout(16, 4, "contiguous"), causal=True) == [16, 32, 48, 64]
    assert cp.work_formula(cp.layout(16, 4, "zigzag"), causal=True) == [36] * 4  # (2n + 1) chunk pairs
    assert cp.work_formula(cp.layout(16, 4, "contiguous"), causal=False) == [64] * 4


@pytest.mark.parametrize("args, says", [
    ((1000, 3, "zigzag"), "sequence length 1000 cannot be cut into 2 x 3 = 6 equal chunks, which zig-zag "
                          "sharding over 3 ranks needs; pick a multiple of 6 such as 996 or 1002 (or contiguous "
                          "sharding, which needs a multiple of 3)"),
    ((10, 4, "contiguous"), "sequence length 10 cannot be cut into 4 equal chunks, one per rank; pick a "
                            "multiple of 4 such as 8 or 12."),
    ((3, 4, "zigzag"), "pick a multiple of 8 such as 8 (or"),
    ((64, 2, "ring"), "sharding 'ring' is not one of contiguous, zigzag"),
    ((64, 0, "zigzag"), "world_size must be a whole number of at least 1, got 0"),
    ((64.0, 2, "zigzag"), "seq_len must be a whole number of at least 1, got 64.0"),
])
def test_impossible_layouts_say_what_would_work(args, says):
    with pytest.raises(ConfigError) as info:
        cp.layout(*args)
    assert says in str(info.value)


def test_a_shard_of_the_wrong_size_is_refused():
    lay = cp.layout(16, 2, "zigzag")
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ConfigError, match=r"rank 1 was given q of shape \(1, 2, 16, 4\); it needs \(batch, heads, 8"):
        lay.check_shard(torch.zeros(1, 2, 16, 4), q, q, 1, 2)
    with pytest.raises(ConfigError, match="the layout is for 2 ranks but the ring has 4"):
        lay.check_shard(q, q, q, 1, 4)
    with pytest.raises(ConfigError, match=r"given q \(1, 2, 8, 4\), k \(1, 1, 8, 4\) and v \(1, 2, 8, 4\); ring "
                                          "attention here needs all three of the same shape"):
        lay.check_shard(q, torch.zeros(1, 1, 8, 4), q, 1, 2)


def test_a_layout_cannot_be_made_impossible_directly():
    with pytest.raises(ConfigError, match="sequence length 10 cannot be cut into 2 x 2 = 4 equal chunks"):
        cp.Layout(10, 2, "zigzag")


@pytest.mark.parametrize("options, says", [
    ({"heads": 0}, "heads must be a whole number of at least 1, got 0"),
    ({"head_dim": 2.5}, "head_dim must be a whole number of at least 1, got 2.5"),
    ({"dtype": "float16"}, "dtype 'float16' is not one of float32, float64"),
])
def test_bad_sizes_are_refused(options, says):
    with pytest.raises(ConfigError, match=says):
        cp.inputs(16, **options)


@pytest.mark.slow
def test_bad_settings_on_the_ranks_leave_the_cluster_usable(cluster2):
    with pytest.raises(ppkit.RemoteError, match="cannot be cut into 2 x 2 = 4 equal chunks"):
        cluster2.run(cp.compare, seq_len=30)
    with pytest.raises(ppkit.RemoteError, match="ranks=3: the world has 2 ranks, so the mesh can use 1 to 2"):
        cluster2.run(cp.torch_context_parallel, ranks=3)
    with pytest.raises(ppkit.RemoteError, match="kernel 'flash' is not one of default, math"):
        cluster2.run(cp.torch_context_parallel, kernel="flash")
    assert cluster2.state == "ready"
    assert max(cluster2.run(cp.compare, seq_len=32)[0].values()) < 1e-5


# -- torch's own ---------------------------------------------------------------------------------

TORCH_214 = pytest.mark.skipif(not torch.__version__.startswith("2.14."),
                               reason="notebook 11 describes torch 2.14's behaviour on CPU")


@TORCH_214
def test_torch_context_parallel_on_cpu_is_as_the_notebook_says(cluster2):
    for kernel, error in (("default", "NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu"
                                      ".default does not have a sharding strategy registered."),
                          ("math", "RuntimeError: aten.add.Tensor got mixed torch.Tensor and DTensor")):
        causal = cluster2.run(cp.torch_context_parallel, causal=True, kernel=kernel)[0]
        assert not causal["ran"] and causal["error"].startswith(error), causal
    plain = cluster2.run(cp.torch_context_parallel, backward=True, kernel="math")[0]
    assert plain["ran"] and plain["forward"] < 1e-5 and plain["backward"] < 1e-5
    # K and V gathered whole (forward, and again for backward), their gradients reduce-scattered: no ring
    assert plain["collectives"] == {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 2}
    assert max(cluster2.run(cp.compare, seq_len=32)[0].values()) < 1e-5  # and ppkit's ring still works


@pytest.mark.slow
@TORCH_214
@pytest.mark.slow
def test_torch_context_parallel_default_kernel_without_mask(cluster4):
    """The forward runs (after DTensor's slow first sharding propagation, 10-40 s), the backward does not."""
    plain = cluster4.run(cp.torch_context_parallel, ranks=2, timeout=180)
    assert plain[0]["ran"] and plain[0]["forward"] < 1e-5 and plain[2:] == [None, None]
    backward = cluster4.run(cp.torch_context_parallel, ranks=2, backward=True)[1]
    assert not backward["ran"] and "_scaled_dot_product_flash_attention_for_cpu_backward" in backward["error"]
