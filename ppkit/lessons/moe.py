"""Lesson 12, a mixture-of-experts layer in one process: what expert parallelism must equal.

    s = settings(experts=8, top_k=2, capacity_factor=1.25)  MoESettings, every value checked
    p = parameters(s)             the router and every expert's weights, the same in every process
    x = tokens(s, rank)           rank ``rank``'s tokens (rows of ``s.hidden`` numbers)
    r = route(x, p.router, s)     Routing: each token's top-k experts and gates, which (token, choice)
                                  the capacity keeps, tokens per expert, the auxiliary loss
    expert_mlp(x, w1, w2)         one expert: relu(x @ w1) @ w2
    reference(groups, p, s)       the whole layer on every rank's tokens, here, expert by expert

The router is replicated: every rank routes its own tokens. Capacity is per rank and per expert (GShard's
local groups): rank r keeps at most ``capacity(T)`` of its (token, choice) pairs for each expert, first
choices before second ones, earlier tokens first, so a rank decides its drops before anything is sent.
A dropped pair contributes nothing; a token whose every choice was dropped gets an output of 0 (the
residual connection around the layer carries it on in a transformer). ``skew`` adds a bias to the
router's logits that favours the first experts (0: none), to see what imbalance does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ppkit.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def whole_number(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}.")
    return value


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _multiples(value: int, step: int) -> str:
    below, above = value // step * step, (value // step + 1) * step
    return f"{below} or {above}" if below > 0 else f"{above}"


@dataclass(frozen=True)
class MoESettings:
    """One MoE layer: ``experts`` expert MLPs (hidden -> ffn -> hidden), each token sent to ``top_k``
    of them, at most ``capacity(T)`` (token, choice) pairs per expert from each rank's T tokens."""

    experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25
    hidden: int = 16
    ffn: int = 32
    tokens: int = 32          # per rank
    skew: float = 0.0
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("experts", "hidden", "ffn", "tokens"):
            whole_number(name, getattr(self, name))
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.experts:
            raise ConfigError(f"top_k={self.top_k!r}: each token picks top_k different experts out of "
                              f"{self.experts}, so top_k must be a whole number from 1 to {self.experts}.")
        cf = self.capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < math.inf:
            raise ConfigError(f"capacity_factor={cf!r}: it must be a finite number above 0. 1.0 lets each expert "
                              "take its fair share (tokens x top_k / experts) of a rank's choices; 1.25 leaves "
                              f"room for some imbalance; {self.experts / self.top_k:g} (experts / top_k) drops "
                              "nothing.")
        if isinstance(self.skew, bool) or not isinstance(self.skew, (int, float)) or not math.isfinite(self.skew):
            raise ConfigError(f"skew={self.skew!r}: it must be a finite number (0: no bias; 2: the first experts "
                              "are strongly preferred).")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}.")

    def capacity(self, num_tokens: int | None = None) -> int:
        """Most (token, choice) pairs one expert takes from one rank: ceil(factor x T x top_k / experts)."""
        num_tokens = self.tokens if num_tokens is None else num_tokens
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.experts)

    def experts_per_rank(self, world_size: int) -> int:
        """Experts each rank holds (rank r: experts r x n .. r x n + n - 1); refused if they do not divide."""
        whole_number("world_size", world_size)
        if self.experts % world_size:
            raise ConfigError(
                f"{self.experts} experts cannot be spread evenly over {world_size} ranks; pick a number of experts "
                f"that is a multiple of {world_size} (such as {_multiples(self.experts, world_size)}), or a number "
                f"of ranks that divides {self.experts} ({_divisors(self.experts)}).")
        return self.experts // world_size

    def owner(self, expert: int, world_size: int) -> int:
        return expert // self.experts_per_rank(world_size)


def settings(**options) -> MoESettings:
    """A ``MoESettings``; a ConfigError says which value is impossible and what would work."""
    return MoESettings(**options)


@dataclass
class Parameters:
    router: torch.Tensor   # (hidden, experts)
    w1: torch.Tensor       # (experts, hidden, ffn)
    w2: torch.Tensor       # (experts, ffn, hidden)

    def local(self, rank: int, world_size: int, s: MoESettings) -> Parameters:
        """Rank ``rank``'s share: the whole router (replicated) and its own experts' weights."""
        n = s.experts_per_rank(world_size)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"rank={rank!r}: with {world_size} ranks it must be 0 to {world_size - 1}.")
        mine = slice(rank * n, (rank + 1) * n)
        return Parameters(self.router, self.w1[mine], self.w2[mine])

    def trainable(self) -> Parameters:
        """A copy whose tensors are leaves that collect gradients."""
        return Parameters(*(t.detach().clone().requires_grad_() for t in (self.router, self.w1, self.w2)))


def parameters(s: MoESettings, seed: int = 0) -> Parameters:
    """The same weights in every process that asks (a seeded generator, nothing global)."""
    g = torch.Generator().manual_seed(seed)
    dtype = DTYPES[s.dtype]

    def randn(*shape, fan_in):
        return torch.randn(*shape, generator=g, dtype=dtype) / math.sqrt(fan_in)

    return Parameters(randn(s.hidden, s.experts, fan_in=s.hidden), randn(s.experts, s.hidden, s.ffn, fan_in=s.hidden),
                      randn(s.experts, s.ffn, s.hidden, fan_in=s.ffn))


def tokens(s: MoESettings, rank: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tokens (tokens, hidden) and an upstream gradient of the same shape."""
    g = torch.Generator().manual_seed(1000 * seed + 17 + rank)
    return tuple(torch.randn(s.tokens, s.hidden, generator=g, dtype=DTYPES[s.dtype]) for _ in range(2))


def skew_bias(s: MoESettings) -> torch.Tensor:
    """Added to the router's logits: from +skew for expert 0 down to 0 for the last one."""
    return s.skew * torch.linspace(1.0, 0.0, s.experts, dtype=DTYPES[s.dtype])


@dataclass
class Routing:
    """Where one rank's tokens go. ``experts``, ``gates``, ``keep``: (tokens, top_k), choice 0 the best."""

    experts: torch.Tensor     # expert index of each (token, choice)
    gates: torch.Tensor       # its router probability (differentiable): the weight of that expert's output
    keep: torch.Tensor        # False where the expert's capacity was full: the pair is dropped
    capacity: int
    aux_loss: torch.Tensor    # Switch Transformer's load-balancing loss; 1.0 when perfectly balanced
    num_experts: int

    def chosen_per_expert(self) -> torch.Tensor:
        """(token, choice) pairs that picked each expert, before capacity."""
        return torch.bincount(self.experts.flatten(), minlength=self.num_experts)

    def kept_per_expert(self) -> torch.Tensor:
        return torch.bincount(self.experts[self.keep], minlength=self.num_experts)

    @property
    def dropped_pairs(self) -> int:
        return int((~self.keep).sum())

    @property
    def dropped_tokens(self) -> int:
        """Tokens none of whose choices was kept: the layer's output for them is 0."""
        return int((~self.keep.any(-1)).sum())


def capacity_keep(experts: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Which (token, choice) pairs fit: for each expert, the first ``capacity`` of them taken in the order
    all first choices (token 0, 1, ...), then all second choices, and so on."""
    order = experts.T.reshape(-1)                               # choice-major
    one_hot = F.one_hot(order, num_experts)
    position = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)      # place in its expert's queue, from 0
    return (position < capacity).view(experts.shape[1], experts.shape[0]).T


def aux_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """E x sum_e f_e x P_e: f_e the share of (token, choice) pairs that picked expert e, P_e its mean
    router probability. Only P carries a gradient; the sum is least, 1.0, when both are uniform."""
    num_experts = probs.shape[-1]
    share = torch.bincount(experts.flatten(), minlength=num_experts).to(probs.dtype) / experts.numel()
    return num_experts * (share * probs.mean(0)).sum()


def route(x: torch.Tensor, router: torch.Tensor, s: MoESettings) -> Routing:
    """Top-k routing of ``x`` (tokens, hidden) with capacity; gates are the chosen experts' softmax
    probabilities (not renormalised, as in GShard and Switch, so the router learns even with top-1)."""
    probs = (x @ router + skew_bias(s)).softmax(-1)
    gates, experts = probs.topk(s.top_k, dim=-1)
    cap = s.capacity(x.shape[0])
    return Routing(experts, gates, capacity_keep(experts, s.experts, cap), cap, aux_loss(probs, experts), s.experts)


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w1) @ w2


def moe_layer(x: torch.Tensor, p: Parameters, s: MoESettings) -> tuple[torch.Tensor, Routing]:
    """The layer on one rank's tokens with every expert in this process: for each expert, its kept
    (token, choice) pairs, its MLP on those tokens, weighted by their gates, added into the output."""
    r = route(x, p.router, s)
    y = torch.zeros_like(x)
    for e in range(s.experts):
        token, choice = ((r.experts == e) & r.keep).nonzero(as_tuple=True)
        if len(token):
            y = y.index_add(0, token, expert_mlp(x[token], p.w1[e], p.w2[e]) * r.gates[token, choice, None])
    return y, r


def reference(groups, p: Parameters, s: MoESettings) -> tuple[list[torch.Tensor], list[Routing]]:
    """The layer on each rank's tokens (``groups[r]``), every expert here: what expert parallelism must give."""
    outs, routings = zip(*(moe_layer(x, p, s) for x in groups))
    return list(outs), list(routings)
