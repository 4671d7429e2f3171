"""Lesson 10, sequence parallelism with torch's DTensor plans, and the Playbook's activation formulas for TP and SP.

    PLAN             the block's plan: ``SequenceParallel`` on the norms, ``PrepareModuleInput`` (Shard(1) ->
                     Replicate: the all_gather) on attention and MLP, ``ColwiseParallel`` on q, k, v, fc1,
                     ``RowwiseParallel(output_layouts=Shard(1))`` on o and fc2 (the reduce_scatter)
    dtensor_compare  that plan on lesson 10's block against the one written by hand (sequence_parallel):
                     output, input gradient, every parameter's gradient; the collectives CommDebugMode counted;
                     the activation bytes autograd keeps on the rank
    playbook_tp, playbook_sp    per layer, 16-bit, dropout on: sbh(10 + 24/t + 5as/(ht)), sbh/t(34 + 5as/h)
    kept_tp, kept_sp            what this lesson's block keeps in fp32 (no dropout, SDPA: no s x s matrix)
"""

from __future__ import annotations

import torch.distributed as dist

from ppkit.lessons import sequence_parallel as sp
from ppkit.lessons import step_memory as sm
from ppkit.lessons import tensor_parallel as tp


def plan():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
    return {"norm1": SequenceParallel(), "attn": PrepareModuleInput(**gather),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "norm2": SequenceParallel(), "mlp": PrepareModuleInput(**gather),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))}


def dtensor_compare(rank: int, world_size: int, size: sp.Size = sp.SMALL) -> dict:
    """``parallelize_module(block, mesh, plan())`` on a CPU mesh against ``SequenceParallelBlock``: the same
    input shard and upstream gradient; the largest differences and what each side sent and kept."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    sp.check_size(size, world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    torch_block, hand_full = sp.Block(size), sp.Block(size)
    hand = sp.SequenceParallelBlock(hand_full, rank, world_size, sp.CommLog())
    parallelize_module(torch_block, mesh, plan())
    x, upstream = sp._inputs(size)
    tokens = tp.part(size.seq, rank, world_size, "the sequence")
    x_torch, x_hand = (x[:, tokens].clone().requires_grad_() for _ in range(2))
    mode = CommDebugMode()
    with mode:  # one context for forward and backward: CommDebugMode follows the modules through both
        with sm.SavedTensors(torch_block) as kept_torch:
            y_torch = torch_block(x_torch)
        (y_torch * upstream[:, tokens]).sum().backward()
    with sm.SavedTensors(hand) as kept_hand:
        y_hand = hand(x_hand)
    (y_hand * upstream[:, tokens]).sum().backward()
    for p in (*hand.norm1.parameters(), *hand.norm2.parameters(), hand.o_bias, hand.fc2_bias):
        dist.all_reduce(p.grad)  # see sequence_parallel.compare
    hand_params = dict(hand.named_parameters())
    names = {"attn.q.": "q.", "attn.k.": "k.", "attn.v.": "v.", "mlp.fc1.": "fc1.",
             "attn.o.weight": "o_weight", "attn.o.bias": "o_bias", "mlp.fc2.weight": "fc2_weight",
             "mlp.fc2.bias": "fc2_bias"}

    def hand_name(name):
        for prefix, new in names.items():
            if name.startswith(prefix):
                return new + name[len(prefix):] if prefix.endswith(".") else new
        return name

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    def full(t):
        return t.full_tensor() if isinstance(t, DTensor) else t

    grads = max(sp._diff(tp.my_part(full(p.grad), hand_params[hand_name(n)].grad, rank, world_size),
                         hand_params[hand_name(n)].grad) for n, p in torch_block.named_parameters())
    counts = {str(k).split(".")[-1]: v for k, v in mode.get_comm_counts().items()}
    return {"forward": sp._diff(local(y_torch), y_hand), "input_grad": sp._diff(x_torch.grad, x_hand.grad),
            "param_grads": grads, "collectives": counts, "activation_bytes": kept_torch.total(),
            "hand_activation_bytes": kept_hand.total()}


# -- activation memory per layer ------------------------------------------------------------------------------

def playbook_tp(s: int, b: int, h: int, a: int, t: int) -> float:
    """Tensor parallel alone (Korthikanti et al.): norms, dropouts and the Linears' inputs stay whole."""
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def playbook_sp(s: int, b: int, h: int, a: int, t: int) -> float:
    """Tensor + sequence parallel: everything split over t ranks (the gathered inputs are not kept)."""
    return s * b * h / t * (34 + 5 * a * s / h)


def kept_tp(size: sp.Size, t: int) -> float:
    """What this lesson's TP block keeps per rank in fp32: whole, the norms' inputs and outputs (4 sbh); split,
    Q K V, the attention output (also the o layer's input), GELU's and fc2's inputs (12 sbh / t); SDPA's
    log-sum-exp per row and head, and the norms' means and 1/stds."""
    s, b, h, a = size.seq, size.batch, size.d_model, size.heads
    return 4 * s * b * h * (4 + 12 / t) + 4 * a * s * b / t + 16 * s * b


def kept_sp(size: sp.Size, t: int) -> float:
    """The same with SP: the norms' inputs (and statistics) on the shard, but the all-gathered inputs of q/k/v
    and fc1 kept whole (2 sbh): autograd keeps a Linear's input for its weight's gradient. Megatron-LM keeps the
    shard instead and all-gathers it again in backward, which is what the Playbook's formula assumes."""
    s, b, h, a = size.seq, size.batch, size.d_model, size.heads
    return 4 * s * b * h * (2 + 2 / t + 12 / t) + 4 * a * s * b / t + 16 * s * b / t
