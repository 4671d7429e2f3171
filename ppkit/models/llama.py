"""A small Llama-style decoder for the capstone (notebook 14): RMSNorm, rotary position embeddings (RoPE), SwiGLU
MLP, causal attention through ``F.scaled_dot_product_attention``; byte tokens (ppkit.data). The module names are
torchtitan's Llama (``tok_embeddings``, ``layers.N.attention.wq``, ``feed_forward.w1``, ``norm``, ``output``), so
its tensor-parallel plan reads the same here.

    Config      the sizes (a frozen dataclass); the defaults train on 2 CPU cores in seconds
    Llama       the whole model, or (after ``keep_stage``) one pipeline stage of it, full-model names kept
    matmul_params   N of 08c's "6N": every weight that multiplies (the embedding is a lookup, norms elementwise)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    vocab: int = 256        # bytes
    dim: int = 64
    heads: int = 4
    hidden: int = 128       # SwiGLU's inner width
    layers: int = 4
    seq: int = 32           # tokens per sequence (RoPE's table is this long)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def params(self) -> int:
        """Every parameter: embedding, per block 2 norms + wq wk wv wo + w1 w2 w3, final norm, output."""
        block = 2 * self.dim + 4 * self.dim * self.dim + 3 * self.dim * self.hidden
        return self.vocab * self.dim + self.layers * block + self.dim + self.dim * self.vocab


def matmul_params(config: Config) -> int:
    """The parameters that multiply in a forward (08c's N): the blocks' seven Linears and the output head."""
    return config.layers * (4 * config.dim * config.dim + 3 * config.dim * config.hidden) + config.dim * config.vocab


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean and the bias (Zhang and Sennrich 2019)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency, (seq, head_dim / 2): pair i of a head turns by theta^(-2i/d) a token."""
    freqs = config.rope_theta ** -(torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim)
    angles = torch.outer(torch.arange(config.seq, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate each (even, odd) pair of ``x`` (batch, heads, seq, head_dim) by its position's angle."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    t = x.shape[-2]
    c, s = cos[:t], sin[:t]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        d = config.dim
        self.head_dim = config.head_dim
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        cos, sin = rope_tables(config)
        self.register_buffer("cos", cos, persistent=False)  # recomputed, not checkpointed
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism wq, wk, wv hold only this rank's heads
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rope(q, self.cos, self.sin), apply_rope(k, self.cos, self.sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(a.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: Config):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.hidden, bias=False)
        self.w3 = nn.Linear(config.dim, config.hidden, bias=False)
        self.w2 = nn.Linear(config.hidden, config.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: Config):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids (batch, seq) to logits (batch, seq, vocab); the same weights for a given ``seed``."""

    def __init__(self, config: Config = Config(), seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.dim)
        self.layers = nn.ModuleDict({str(i): Block(config) for i in range(config.layers)})
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h)) if self.output is not None else h

    def keep_stage(self, stage: int, stages: int) -> Llama:
        """Delete what pipeline stage ``stage`` of ``stages`` does not run (its share of the blocks stays; the
        first stage keeps the embedding, the last the norm and output). Names stay the whole model's, so a
        checkpoint's keys mean the same on every mesh."""
        per = len(self.layers) // stages
        for i in list(self.layers):
            if not stage * per <= int(i) < (stage + 1) * per:
                del self.layers[i]
        if stage > 0:
            self.tok_embeddings = None
        if stage < stages - 1:
            self.norm = self.output = None
        return self
