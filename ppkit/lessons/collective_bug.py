"""Notebook 02's planted collective bug: a 4-rank training loop whose loss logging is a collective that
only rank 0 calls. The other ranks go on to the next step's gradient all_reduce, so gloo pairs rank 0's
one-number all_reduce with their three-number one: the collective doctor names it (sizes [] against [3]).

``planted_loop`` is the loop with the bug, ``reference`` what a right loop gives, computed in one process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

LOG_EVERY = 2  # the loss is logged at steps 0, 2, 4, ...
LR = 0.1
TRUE_WEIGHTS = (1.0, -2.0, 0.5)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: 8 samples of a linear model with ``TRUE_WEIGHTS``."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 3, generator=gen)
    return x, x @ torch.tensor(TRUE_WEIGHTS)


def loss_and_grad(weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean squared error at ``weights`` (a 0-d tensor) and its gradient."""
    w = weights.clone().requires_grad_(True)
    loss = ((x @ w - y) ** 2).mean()
    loss.backward()
    return loss.detach(), w.grad


def planted_loop(rank: int, world_size: int, steps: int = 4) -> tuple[list[float], list[float]]:
    """(the mean losses logged, the final weights) on every rank; with the planted bug, it hangs or fails."""
    weights, logged = torch.zeros(3), []
    for step in range(steps):
        loss, grad = loss_and_grad(weights, *batch(rank, step))
        dist.all_reduce(grad)                    # every rank: the gradients' sum...
        weights -= LR * grad / world_size        # ...averaged, so every rank takes the same step
        if rank == 0 and step % LOG_EVERY == 0:  # the bug: a collective that only rank 0 calls
            dist.all_reduce(loss)
            logged.append(loss.item() / world_size)
            print(f"step {step}: mean loss {logged[-1]:.4f}")
    return logged, weights.tolist()


def reference(world_size: int, steps: int) -> tuple[list[float], list[float], dict[int, list[float]]]:
    """(the mean losses a right loop logs, its final weights, each rank's own loss at the logged steps)."""
    weights, logged, own = torch.zeros(3), [], {rank: [] for rank in range(world_size)}
    for step in range(steps):
        results = [loss_and_grad(weights, *batch(rank, step)) for rank in range(world_size)]
        if step % LOG_EVERY == 0:
            for rank, (loss, _) in enumerate(results):
                own[rank].append(loss.item())
            logged.append(sum(loss.item() for loss, _ in results) / world_size)
        weights = weights - LR * sum(grad for _, grad in results) / world_size
    return logged, weights.tolist(), own
