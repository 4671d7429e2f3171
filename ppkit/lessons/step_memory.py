"""Lesson 08b: what one training step holds in memory, counted with torch's own tools and set beside the formulas.

    Size              the small GPT's sizes (a frozen dataclass); ``params()`` counts its parameters
    GPT               embedding, pre-norm blocks (causal attention, an MLP), final norm, head; each block can
                      recompute nothing, its attention core ("selective") or all of itself ("full") in backward
    static_formula    bytes of parameters, gradients and Adam per parameter: fp32 4 + 4 + 8, mixed 2 + 2 + 4 + 4 + 4
    static_measured   the same bytes read off a model and its optimizer after one step
    playbook_activations  the Playbook's s b h (34 + 5 a s / h) bytes per layer (16-bit, dropout on)
    kept_formula      the same breakdown (Korthikanti et al. 2022) for what this model keeps: element size,
                      dropout, whether the attention matrix is kept
    saved_by_layer    what autograd keeps for backward, per block, measured with ``saved_tensors_hooks``

The breakdown per layer, in values of the activation's element size e (Korthikanti et al., table 2):
LayerNorms 2 sbh; attention: QKV input sbh, Q and K 2 sbh, softmax output a s^2 b, V sbh, projection input sbh;
MLP: fc1 input sbh, GELU input 4 sbh, fc2 input 4 sbh; dropout adds masks (1 byte each: sbh after attention,
sbh after the MLP, a s^2 b after the softmax) and its own output over V (a s^2 b values). With e = 2 and
dropout: 34 sbh + 5 a s^2 b.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ppkit.errors import ConfigError

POLICIES = ("none", "selective", "full")


@dataclass(frozen=True)
class Size:
    vocab: int = 256
    d_model: int = 64        # h
    heads: int = 4           # a
    layers: int = 2
    dropout: float = 0.0
    attention: str = "math"  # "math": softmax(QK^T)V in plain ops, keeps the s x s matrix; "sdpa": torch's kernel

    def params(self) -> int:
        """Parameters: embedding, blocks (2 norms, qkv, proj, fc1, fc2), final norm, head."""
        h = self.d_model
        block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
        return self.vocab * h + self.layers * block + 2 * h + h * self.vocab + self.vocab


SIZE = Size()


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ConfigError(f"recompute policy {policy!r} is not one of {', '.join(POLICIES)}: 'none' keeps every "
                          "activation, 'selective' recomputes the attention core, 'full' the whole block.")
    return policy


class Block(nn.Module):
    def __init__(self, size: Size):
        super().__init__()
        h = size.d_model
        self.heads, self.p, self.attention = size.heads, size.dropout, size.attention
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        self.policy = "none"

    def core(self, q, k, v):
        """softmax(Q K^T / sqrt(d)) V over causal keys: what selective recomputation recomputes."""
        drop = self.p if self.training else 0.0
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        weights = F.dropout(scores.masked_fill(mask, float("-inf")).softmax(-1), drop, self.training)
        return weights @ v

    def attend(self, x):
        b, s, h = x.shape
        # contiguous q, k, v: the matmuls then keep exactly these (a view would make them keep copies)
        q, k, v = (t.contiguous() for t in self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4))
        if self.policy == "selective":
            out = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            out = self.core(q, k, v)
        out = out.transpose(1, 2).reshape(b, s, h)
        return F.dropout(self.proj(out), self.p, self.training)

    def body(self, x):
        x = x + self.attend(self.ln1(x))
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), self.p, self.training)

    def forward(self, x):
        if self.policy == "full":
            return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class GPT(nn.Module):
    def __init__(self, size: Size = SIZE, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.size = size
        self.embed = nn.Embedding(size.vocab, size.d_model)
        self.blocks = nn.ModuleList(Block(size) for _ in range(size.layers))
        self.norm, self.head = nn.LayerNorm(size.d_model), nn.Linear(size.d_model, size.vocab)

    def recompute(self, policy: str) -> GPT:
        """Recompute nothing, the attention core or each whole block in backward; returns the model."""
        for block in self.blocks:
            block.policy = check_policy(policy)
        return self

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, tokens):
        """Next-token loss: each position predicts the following token."""
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def batch(size: Size, microbatch_size: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    """``microbatch_size`` sequences of ``seq_len`` tokens to learn from (one more token for the targets)."""
    if microbatch_size < 1 or seq_len < 1:
        raise ConfigError(f"a batch needs at least one sequence of at least one token; got micro-batch size "
                          f"{microbatch_size} and sequence length {seq_len}.")
    return torch.randint(0, size.vocab, (microbatch_size, seq_len + 1),
                         generator=torch.Generator().manual_seed(seed))


# -- the static part: parameters, gradients, optimizer states -------------------------------------------------

STATIC_BYTES = {"fp32": {"params": 4, "grads": 4, "adam": 8},
                "mixed": {"params (bf16)": 2, "grads (bf16)": 2, "master (fp32)": 4, "adam": 8}}


def static_formula(num_params: int, precision: str = "fp32") -> dict[str, int]:
    """Bytes per category for ``num_params`` parameters trained with Adam (Playbook, first chapter)."""
    return {name: per * num_params for name, per in STATIC_BYTES[precision].items()}


def static_measured(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the parameters, their gradients and the optimizer's states, read off the tensors themselves."""
    params = list(model.parameters())
    moments = [t for p in params for name, t in optimizer.state[p].items() if name != "step"]
    steps = [t for p in params for name, t in optimizer.state[p].items() if name == "step"]
    return {"params": sum(p.nbytes for p in params),
            "grads": sum(p.grad.nbytes for p in params if p.grad is not None),
            "adam": sum(t.nbytes for t in moments),
            "adam step counters": sum(t.nbytes for t in steps)}


# -- activations --------------------------------------------------------------------------------------------

def playbook_activations(s: int, b: int, h: int, a: int) -> float:
    """The Playbook's activation bytes per layer, 16-bit values with dropout: s b h (34 + 5 a s / h)."""
    return s * b * h * (34 + 5 * a * s / h)


def kept_formula(s: int, b: int, h: int, a: int, element_size: int = 2, dropout: bool = True,
                 keeps_scores: bool = True) -> float:
    """Korthikanti's breakdown of what one layer keeps, for this element size, with or without dropout, with
    or without the s x s attention matrix (torch's SDPA kernels keep Q K V, their output and a log-sum-exp)."""
    e, sbh, as2b = element_size, s * b * h, a * s * s * b
    kept = 16 * e * sbh                           # norms 2, QKV in 1, Q K V 3, proj in 1, MLP 9: values of e
    if keeps_scores:
        kept += e * as2b                          # softmax output
    else:
        kept += e * sbh + 4 * a * s * b           # the kernel's output and its fp32 log-sum-exp per row
    if dropout:
        kept += 2 * sbh + (as2b + e * as2b if keeps_scores else 0)  # masks (1 byte), dropout output over V
    return kept


def formula_for(size: Size, s: int, b: int, element_size: int = 4) -> float:
    """``kept_formula`` for what ``size``'s model does in this run."""
    return kept_formula(s, b, size.d_model, size.heads, element_size, size.dropout > 0, size.attention == "math")


class SavedTensors:
    """Inside ``with``: what autograd keeps for backward, by storage (a tensor saved by two ops, or a view
    of one saved, counts once), parameters left out; ``layer`` names whose it is (set by block hooks on the
    model's ``blocks``, or its ``layers`` by name).

    A parameter is whatever the model holds as one when the op saves it: FSDP2 swaps each sharded parameter
    for an all-gathered one during forward (and a Linear saves a transposed view of it), so the model's
    parameters are read again at each save, not once at the start; an ``nn.Parameter`` is skipped too."""

    def __init__(self, model: nn.Module):
        self.model, self.layer = model, "outside the layers"
        self.bytes: dict[str, int] = defaultdict(int)
        self.by_dtype: dict[str, int] = defaultdict(int)
        self._seen: set[int] = set()

    def _pack(self, t):
        storage = _local(t).untyped_storage()
        key = storage.data_ptr()
        if key not in self._seen and not isinstance(t, nn.Parameter) and key not in self._params():
            self._seen.add(key)
            self.bytes[self.layer] += storage.nbytes()
            self.by_dtype[str(t.dtype).removeprefix("torch.")] += storage.nbytes()
        return t

    def _params(self) -> set[int]:
        return {_local(p).untyped_storage().data_ptr() for p in self.model.parameters()}

    def _blocks(self) -> dict[str, nn.Module]:
        layers = getattr(self.model, "layers", None)
        if isinstance(layers, nn.ModuleDict):
            return dict(layers.items())
        return {str(i): b for i, b in enumerate(getattr(self.model, "blocks", ()))}

    def __enter__(self):
        blocks = self._blocks()
        self._hooks = [b.register_forward_pre_hook(lambda _m, _a, i=i: setattr(self, "layer", f"layer {i}"))
                       for i, b in blocks.items()]
        self._hooks += [b.register_forward_hook(lambda *_: setattr(self, "layer", "outside the layers"))
                        for b in blocks.values()]
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()

    def total(self) -> int:
        return sum(self.bytes.values())


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (what its memory is), a plain tensor itself."""
    return getattr(t, "_local_tensor", t)


def saved_by_layer(model: GPT, tokens: torch.Tensor, autocast: bool = False) -> SavedTensors:
    """Run one forward of ``model.loss`` and count what autograd keeps (the graph is dropped after)."""
    with SavedTensors(model) as saved, torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        loss = model.loss(tokens)
    del loss
    return saved
