"""The one-process MoE layer of lesson 12: routing and capacity as described (against plain loops), the
layer equal to every expert computed on every token and masked (forward and gradients), the auxiliary
loss, and impossible settings refused with what would work."""

from __future__ import annotations

import math

import pytest
import torch

from ppkit.errors import ConfigError
from ppkit.lessons import moe


def keep_by_loops(experts: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """The capacity rule written out: first choices of tokens 0, 1, ... then second choices, ..."""
    taken = [0] * num_experts
    keep = torch.zeros_like(experts, dtype=torch.bool)
    for choice in range(experts.shape[1]):
        for token in range(experts.shape[0]):
            e = int(experts[token, choice])
            if taken[e] < capacity:
                keep[token, choice] = True
                taken[e] += 1
    return keep


@pytest.mark.parametrize("options", [{}, {"top_k": 1, "capacity_factor": 0.5}, {"skew": 3.0},
                                     {"experts": 5, "top_k": 3, "capacity_factor": 0.8, "tokens": 41}])
def test_capacity_keeps_first_choices_first(options):
    s = moe.settings(**options)
    p = moe.parameters(s)
    r = moe.route(moe.tokens(s, 0)[0], p.router, s)
    assert torch.equal(r.keep, keep_by_loops(r.experts, s.experts, r.capacity))
    assert r.capacity == math.ceil(s.capacity_factor * s.tokens * s.top_k / s.experts)
    assert r.kept_per_expert().max() <= r.capacity
    assert r.dropped_pairs == int((~r.keep).sum()) == int((r.chosen_per_expert() - r.kept_per_expert()).sum())
    assert r.dropped_tokens == sum(not bool(row.any()) for row in r.keep)


def test_routing_picks_the_top_k_probabilities():
    s = moe.settings(experts=6, top_k=3, skew=1.0)
    p = moe.parameters(s)
    x = moe.tokens(s, 1)[0]
    r = moe.route(x, p.router, s)
    probs = (x @ p.router + s.skew * torch.linspace(1, 0, 6)).softmax(-1)
    for t in range(s.tokens):
        best = sorted(range(6), key=lambda e: -float(probs[t, e]))[:3]
        assert r.experts[t].tolist() == best
        assert torch.allclose(r.gates[t], probs[t, best])


def test_skew_favours_the_first_experts_and_raises_the_aux_loss():
    plain, skewed = (moe.settings(tokens=512, skew=skew) for skew in (0.0, 3.0))
    routes = [moe.route(moe.tokens(s, 0)[0], moe.parameters(s).router, s) for s in (plain, skewed)]
    assert routes[1].chosen_per_expert()[0] > 2 * routes[0].chosen_per_expert()[0]
    assert routes[1].dropped_pairs > routes[0].dropped_pairs
    assert 0.95 < float(routes[0].aux_loss) < 1.2 < float(routes[1].aux_loss)


def test_aux_loss_is_one_when_balanced():
    probs = torch.full((8, 4), 0.25, requires_grad=True)
    experts = torch.tensor([[0, 1], [2, 3]] * 4)
    loss = moe.aux_loss(probs, experts)
    assert float(loss.detach()) == pytest.approx(1.0)
    loss.backward()
    assert torch.allclose(probs.grad, torch.full((8, 4), 4 * 0.25 / 8))  # E x f_e / T


def dense_layer(x, p, s):
    """Every expert on every token, weighted by the gate where the pair was kept, 0 elsewhere."""
    r = moe.route(x, p.router, s)
    weights = torch.zeros(x.shape[0], s.experts, dtype=x.dtype)
    weights = weights.scatter_add(1, r.experts, r.gates * r.keep)
    outs = torch.stack([moe.expert_mlp(x, p.w1[e], p.w2[e]) for e in range(s.experts)], 1)
    return (weights.unsqueeze(-1) * outs).sum(1)


@pytest.mark.parametrize("options", [{}, {"top_k": 1, "capacity_factor": 0.5, "skew": 2.0},
                                     {"experts": 3, "top_k": 3, "capacity_factor": 3.0}])
def test_the_layer_equals_every_expert_masked_forward_and_backward(options):
    s = moe.settings(dtype="float64", **options)
    grads = []
    for layer in (lambda x, p: moe.moe_layer(x, p, s)[0], lambda x, p: dense_layer(x, p, s)):
        p = moe.parameters(s).trainable()
        x, up = (t.clone() for t in moe.tokens(s, 2))
        x.requires_grad_()
        y = layer(x, p)
        (y * up).sum().backward()
        grads.append([y, x.grad, p.router.grad, p.w1.grad, p.w2.grad])
    for got, want in zip(*grads):
        assert torch.allclose(got, want, atol=1e-12)


def test_a_rank_gets_its_own_block_of_experts():
    s = moe.settings(experts=8)
    p = moe.parameters(s)
    local = p.local(2, 4, s)
    assert torch.equal(local.w1, p.w1[4:6]) and torch.equal(local.router, p.router)
    assert [s.owner(e, 4) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert torch.equal(moe.tokens(s, 1)[0], moe.tokens(s, 1)[0]) and not torch.equal(moe.tokens(s, 0)[0],
                                                                                      moe.tokens(s, 1)[0])
    with pytest.raises(ConfigError, match="rank=4: with 4 ranks it must be 0 to 3"):
        p.local(4, 4, s)


@pytest.mark.parametrize("options, says", [
    ({"experts": 4, "top_k": 5}, "top_k=5: each token picks top_k different experts out of 4, so top_k must be a "
                                 "whole number from 1 to 4."),
    ({"top_k": 0}, "top_k=0: each token picks top_k different experts out of 8"),
    ({"capacity_factor": 0}, "capacity_factor=0: it must be a finite number above 0. 1.0 lets each expert take its "
                             "fair share (tokens x top_k / experts) of a rank's choices; 1.25 leaves room for some "
                             "imbalance; 4 (experts / top_k) drops nothing."),
    ({"capacity_factor": -1.0}, "capacity_factor=-1.0: it must be a finite number above 0"),
    ({"capacity_factor": math.nan}, "capacity_factor=nan: it must be a finite number above 0"),
    ({"capacity_factor": True}, "capacity_factor=True: it must be a finite number above 0"),
    ({"skew": math.inf}, "skew=inf: it must be a finite number"),
    ({"experts": 0}, "experts must be a whole number of at least 1, got 0"),
    ({"tokens": 2.5}, "tokens must be a whole number of at least 1, got 2.5"),
    ({"dtype": "float16"}, "dtype 'float16' is not one of float32, float64"),
])
def test_impossible_settings_say_what_would_work(options, says):
    with pytest.raises(ConfigError) as info:
        moe.settings(**options)
    assert says in str(info.value)


@pytest.mark.parametrize("experts, ranks, says", [
    (6, 4, "6 experts cannot be spread evenly over 4 ranks; pick a number of experts that is a multiple of 4 "
           "(such as 4 or 8), or a number of ranks that divides 6 (1, 2, 3, 6)."),
    (2, 3, "2 experts cannot be spread evenly over 3 ranks; pick a number of experts that is a multiple of 3 "
           "(such as 3), or a number of ranks that divides 2 (1, 2)."),
    (8, 0, "world_size must be a whole number of at least 1, got 0"),
])
def test_experts_must_divide_over_the_ranks(experts, ranks, says):
    s = moe.settings(experts=experts, top_k=1)
    with pytest.raises(ConfigError) as info:
        s.experts_per_rank(ranks)
    assert says in str(info.value)
