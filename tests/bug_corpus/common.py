"""What several corpus programs share: a small MLP built from a seed, and each step's batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH, LR = 8, 0.1


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)


def my_half(step: int, rank: int, world_size: int):
    return tuple(t.chunk(world_size)[rank] for t in batch(step))


def train(model, rank: int, world_size: int, steps: int) -> None:
    """``steps`` SGD steps of ``model`` (DDP, FSDP2...) on this rank's half of each step's batch."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = my_half(step, rank, world_size)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
