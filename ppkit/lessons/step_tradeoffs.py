"""Lesson 08b: the tools that trade compute for memory before any parallelism, each checked against the plain step.

    gradients           one step's gradients (for comparing recompute policies and accumulation)
    largest_difference  the largest gradient difference, relative to the largest gradient
    mixed_precision     bf16 weights and gradients with fp32 master weights and Adam: bytes by category
    autocast_dtypes     which dtype each operator of a block returns under CPU bf16 autocast
    ddp_accumulate      on a rank: k micro-steps under DDP, with or without ``no_sync``; all-reduces counted

With k micro-batches of b sequences, each loss divided by k, the summed gradients are those of the mean loss
over all k b sequences: one step of k b, up to the order of the sums.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ppkit.lessons import step_memory as sm

TOLERANCE = 1e-5  # float32 sums in another order: relative to the largest gradient


def gradients(size: sm.Size, microbatches: list[torch.Tensor], policy: str = "none") -> dict[str, torch.Tensor]:
    """The gradients of the mean loss over ``microbatches``, accumulated one micro-batch at a time."""
    model = sm.GPT(size).recompute(policy)
    for tokens in microbatches:
        (model.loss(tokens) / len(microbatches)).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    scale = max(g.abs().max().item() for g in a.values())
    return max((a[n] - b[n]).abs().max().item() for n in a) / scale


def mixed_precision(size: sm.Size, s: int, b: int) -> dict[str, int]:
    """One step as mixed-precision training keeps it: the model's weights and gradients in bf16, an fp32
    master copy that Adam updates (and copies back); bytes by category, read off the tensors."""
    model = sm.GPT(size)
    master = [p.detach().clone() for p in model.parameters()]          # fp32
    model.to(torch.bfloat16)
    optimizer = torch.optim.Adam(master, lr=1e-3)
    model.loss(sm.batch(size, b, s)).backward()                         # bf16 gradients
    grads_fp32 = 0
    for m, p in zip(master, model.parameters()):
        m.grad = p.grad.float()                                         # the optimizer reads fp32 gradients
        grads_fp32 += m.grad.nbytes
    optimizer.step()
    with torch.no_grad():
        for m, p in zip(master, model.parameters()):
            p.copy_(m)                                                  # rounded back to bf16 for the next step
    state = [t for m in master for name, t in optimizer.state[m].items() if name != "step"]
    return {"params (bf16)": sum(p.nbytes for p in model.parameters()),
            "grads (bf16)": sum(p.grad.nbytes for p in model.parameters()),
            "master (fp32)": sum(m.nbytes for m in master),
            "adam": sum(t.nbytes for t in state),
            "fp32 gradient copies (during the update)": grads_fp32}


class _DtypeLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: dict[str, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(first, torch.Tensor) and first.is_floating_point():
            self.seen.setdefault(func.overloadpacket.__name__, str(first.dtype).removeprefix("torch."))
        return out


def autocast_dtypes(size: sm.Size, s: int, b: int) -> dict[str, str]:
    """Each operator of one block's forward under ``torch.autocast("cpu", bfloat16)``, and the dtype it returns."""
    model = sm.GPT(size)
    x = model.embed(sm.batch(size, b, s)[:, :-1])
    with torch.autocast("cpu", torch.bfloat16), _DtypeLog() as log:
        model.blocks[0](x)
    return log.seen


class _Loss(torch.nn.Module):
    def __init__(self, gpt: sm.GPT):
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens):
        return self.gpt.loss(tokens)


def ddp_accumulate(rank: int, world_size: int, size: sm.Size, s: int, b: int, accumulation_steps: int,
                   use_no_sync: bool) -> dict:
    """On each rank of a process group: DDP over the model, ``accumulation_steps`` micro-batches of this
    rank's own sequences, all but the last under ``no_sync()`` if ``use_no_sync``; a comm hook counts the
    all-reduces and their bytes. Returns those counts and the gradients (the same on every rank)."""
    from contextlib import nullcontext

    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_Loss(sm.GPT(size)))  # DDP's hooks are armed by its own forward: the loss runs inside it
    counted = {"all_reduces": 0, "bytes": 0}

    def counting_hook(state, bucket):
        counted["all_reduces"] += 1
        counted["bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counting_hook)
    for i in range(accumulation_steps):
        tokens = sm.batch(size, b, s, seed=100 * rank + i)
        last = i == accumulation_steps - 1
        with model.no_sync() if use_no_sync and not last else nullcontext():
            (model(tokens) / accumulation_steps).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.module.gpt.named_parameters()}
    return {**counted, "grads": grads, "params": sum(p.numel() for p in model.parameters()),
            "world_size": dist.get_world_size()}


def ddp_reference(size: sm.Size, s: int, b: int, accumulation_steps: int, world_size: int) -> dict[str, torch.Tensor]:
    """The gradients ``ddp_accumulate`` should give, in one process: the mean loss over every rank's
    micro-batches (DDP averages the ranks' gradients)."""
    microbatches = [sm.batch(size, b, s, seed=100 * r + i)
                    for r in range(world_size) for i in range(accumulation_steps)]
    return gradients(size, microbatches)
