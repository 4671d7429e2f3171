"""Lesson 11, ring attention by hand: the sequence split over the ranks, K/V blocks passed around a ring.

    block_attention(q, k, v, diagonal)  one block of queries against one block of keys: (out, lse)
    merge(out_a, lse_a, out_b, lse_b)   two partial results over disjoint keys -> the result over both
    ring_attention(q, k, v, layout, causal)  this rank's rows of attention over the whole sequence,
                                        differentiable (RingAttention: the reverse ring carries dK/dV)

Each rank holds the rows of q, k and v that ``layout`` (``context_parallel.Layout``) gives it, as a
few equal chunks of the sequence. Forward: in each of world_size steps a rank posts the send of the
K/V blocks it holds to its right neighbour and the receive from its left one, computes its queries
against the blocks it holds while they travel, and merges that partial result into its running one
with the log-sum-exp rule. Backward goes round the ring again with the same K/V blocks; the gradient
of each block (dK, dV) travels with it, one hop behind, and after the last step one more hop brings
every block's gradient home. Under a causal mask a (query chunk, key chunk) pair is computed whole
when the key chunk comes earlier, with the mask when it is the same chunk, and skipped when later.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

KV_TAG, GRAD_TAG = 7, 8  # two streams between the same neighbours: tags keep them apart


def block_attention(q, k, v, diagonal: bool = False):
    """softmax(q kᵀ / √d) v for one block, and lse = log Σ exp(scores) per query row.

    ``diagonal``: q and k are the same chunk of the sequence, so query i sees keys 0..i only."""
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    if diagonal:
        scores = scores.masked_fill(_upper(scores), float("-inf"))
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)  # every exponent <= 0: no overflow
    total = weights.sum(-1, keepdim=True)
    return (weights @ v) / total, (top + total.log()).squeeze(-1)


def _upper(scores):
    rows, cols = scores.shape[-2:]
    return torch.ones(rows, cols, dtype=torch.bool, device=scores.device).triu(1)


def merge(out_a, lse_a, out_b, lse_b):
    """The attention over keys A ∪ B from the attention over A and over B (the exercise's answer).

    exp(lse) is each row's softmax denominator, so the merged denominator is exp(lse_a) + exp(lse_b),
    and each partial output is weighted by its share of it. logaddexp and the differences
    lse_a - lse, lse_b - lse (both <= 0) keep every exponent finite for any size of score."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = out_a * torch.exp(lse_a - lse).unsqueeze(-1) + out_b * torch.exp(lse_b - lse).unsqueeze(-1)
    return out, lse


def pair_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    """"full", "diagonal" or "skip": how query chunk ``q_chunk`` attends to key chunk ``k_chunk``."""
    if not causal or k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else "skip"


# -- the ring -----------------------------------------------------------------------------------

class Ring:
    """Sends to the right neighbour and receives from the left one, in ``group``, without waiting."""

    def __init__(self, group=None):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.right = dist.get_global_rank(group, (self.rank + 1) % self.size) if group else (self.rank + 1) % self.size
        self.left = dist.get_global_rank(group, (self.rank - 1) % self.size) if group else (self.rank - 1) % self.size

    def start(self, tensor, tag: int):
        incoming = torch.empty_like(tensor)
        reqs = [dist.isend(tensor.contiguous(), self.right, group=self.group, tag=tag),
                dist.irecv(incoming, self.left, group=self.group, tag=tag)]
        return incoming, reqs

    @staticmethod
    def wait(pending):
        incoming, reqs = pending
        for req in reqs:
            req.wait()
        return incoming


class NoComm:
    """The same steps with nothing sent, for timing the compute alone: ``blocks[r]`` is rank r's K/V
    block, gathered beforehand. The gradients of dK/dV that it "passes on" are not meaningful."""

    def __init__(self, rank: int, blocks):
        self.rank, self.size, self.blocks, self.calls = rank, len(blocks), blocks, 0

    def start(self, tensor, tag: int):
        if tag != KV_TAG:
            return tensor
        self.calls += 1  # size - 1 calls per pass, forward then backward
        step = (self.calls - 1) % (self.size - 1) + 1
        return self.blocks[(self.rank - step) % self.size]

    @staticmethod
    def wait(pending):
        return pending


def _span(timeline, label: str, kind: str, phase: str):
    return timeline.span(label, kind=kind, phase=phase) if timeline is not None else nullcontext()


class Work:
    """Thread CPU seconds spent computing, per phase: what this rank did, however busy its core was."""

    def __init__(self):
        self.seconds = {"forward": 0.0, "backward": 0.0}

    @contextmanager
    def __call__(self, phase: str):
        start = time.thread_time()
        try:
            yield
        finally:
            self.seconds[phase] += time.thread_time() - start


def _forward(q, k, v, layout, causal, ring, timeline, work, merge_fn):
    chunks = layout.chunks(ring.rank)
    qs = q.split(layout.chunk_size, dim=2)
    acc = [None] * len(qs)  # (out, lse) per query chunk, merged step by step
    kv = torch.stack([k, v])
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        pending = ring.start(kv, KV_TAG) if step + 1 < ring.size else None  # in flight while we compute
        with _span(timeline, f"f{step}", "compute", "forward"), work("forward"):
            ks, vs = kv[0].split(layout.chunk_size, dim=2), kv[1].split(layout.chunk_size, dim=2)
            for i, qc in enumerate(chunks):
                for j, kc in enumerate(layout.chunks(src)):
                    kind = pair_kind(qc, kc, causal)
                    if kind == "skip":
                        continue
                    part = block_attention(qs[i], ks[j], vs[j], diagonal=kind == "diagonal")
                    acc[i] = part if acc[i] is None else merge_fn(*acc[i], *part)
        if pending is not None:
            with _span(timeline, "wait K/V", "comm", "forward"):
                kv = ring.wait(pending)
    return torch.cat([o for o, _ in acc], dim=2), torch.cat([s for _, s in acc], dim=2)


def _block_grads(q, k, v, out_grad, lse, delta, diagonal: bool):
    """dq, dk, dv of one (query chunk, key chunk) pair, from the final lse of the forward: with it,
    exp(scores - lse) is the pair's share of the full softmax, so the pairs' gradients simply add."""
    scale = q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-2, -1)) * scale
    if diagonal:
        scores = scores.masked_fill(_upper(scores), float("-inf"))
    probs = torch.exp(scores - lse.unsqueeze(-1))
    dv = probs.transpose(-2, -1) @ out_grad
    dscores = probs * (out_grad @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return (dscores @ k) * scale, (dscores.transpose(-2, -1) @ q) * scale, dv


def _backward(q, k, v, out, lse, out_grad, layout, causal, ring, timeline, work):
    chunks, size = layout.chunks(ring.rank), layout.chunk_size
    split = [t.split(size, dim=2) for t in (q, out_grad, lse.unsqueeze(-1))]
    delta = (out_grad * out).sum(-1).split(size, dim=2)  # Σ_j dO·O per row, the softmax's backward term
    dq = [torch.zeros_like(c) for c in split[0]]
    kv, dkv, pending_grad = torch.stack([k, v]), None, None
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        pending = ring.start(kv, KV_TAG) if step + 1 < ring.size else None
        with _span(timeline, f"b{step}", "compute", "backward"), work("backward"):
            mine = torch.zeros_like(kv)  # this step's dK, dV for the block held now
            ks, vs = kv[0].split(size, dim=2), kv[1].split(size, dim=2)
            for i, qc in enumerate(chunks):
                for j, kc in enumerate(layout.chunks(src)):
                    kind = pair_kind(qc, kc, causal)
                    if kind == "skip":
                        continue
                    gq, gk, gv = _block_grads(split[0][i], ks[j], vs[j], split[1][i], split[2][i].squeeze(-1),
                                              delta[i], kind == "diagonal")
                    dq[i] += gq
                    mine[0, :, :, j * size:(j + 1) * size] += gk
                    mine[1, :, :, j * size:(j + 1) * size] += gv
        with _span(timeline, "wait dK/dV", "comm", "backward"):
            dkv = mine if pending_grad is None else ring.wait(pending_grad) + mine  # what earlier ranks added
            if pending is not None:
                kv = ring.wait(pending)
        pending_grad = ring.start(dkv, GRAD_TAG)  # on to the next rank; after the last step: home
    with _span(timeline, "wait dK/dV", "comm", "backward"):
        dkv = ring.wait(pending_grad)
    return torch.cat(dq, dim=2), dkv[0], dkv[1]


class RingAttention(torch.autograd.Function):
    """Ring attention forward and backward (``ring_attention`` is the way to call it)."""

    @staticmethod
    def forward(ctx, q, k, v, layout, causal, ring, timeline, work, merge_fn):
        out, lse = _forward(q, k, v, layout, causal, ring, timeline, work, merge_fn)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (layout, causal, ring, timeline, work)
        return out

    @staticmethod
    def backward(ctx, out_grad):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, lse, out_grad.contiguous(), *ctx.options)
        return dq, dk, dv, None, None, None, None, None, None


def ring_attention(q, k, v, layout, causal: bool = False, group=None, ring=None, timeline=None, work=None,
                   merge_fn=merge):
    """This rank's rows of attention over the whole sequence, from its own rows of q, k, v.

    q, k, v: (batch, heads, rows, head_dim), the rows ``layout.positions(rank)`` of the full tensors.
    ``group``: the process group of the ring (default: the whole world). ``timeline``
    (``ppkit.lessons.timeline.Timeline``) records compute and wait spans; ``work`` (a ``Work()``)
    adds up the CPU seconds of compute per phase. ``ring``: ``NoComm`` to time the compute alone.
    ``merge_fn``: how partial results are merged (the notebook's exercise can stand in for ``merge``)."""
    ring = ring or Ring(group)
    layout.check_shard(q, k, v, ring.rank, ring.size)
    return RingAttention.apply(q, k, v, layout, causal, ring, timeline, work or Work(), merge_fn)
