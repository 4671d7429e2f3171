"""Notebook 14's exercise: a tensor-parallel MLP block with a planted bug, found by ``ppkit.compare_runs``.

    Net             the model: a Linear in, an MLP block, a Linear head (what one process runs)
    planted_tp_mlp  the block as the notebook hands it over: Megatron's MLP on this rank's shards, whose input's
                    gradient is never all_reduced (Megatron's f is missing)
    train           on each rank: the model with its block computed by a block function, SGD steps, recorded
    reference       the same steps in one process, recorded the same way

A block function is ``block(x, fc1, fc2, log) -> output``: ``fc1`` is this rank's rows of the first Linear (its
hidden features), ``fc2`` its columns of the second with the whole bias, ``log`` the ``AllReduceLog`` that
``copy_to_parallel`` and ``reduce_from_parallel`` (ppkit.lessons.tensor_parallel) write to. Its output must be the
whole block's output on every rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppkit.lessons.tensor_parallel import MLP, AllReduceLog, part, reduce_from_parallel
from ppkit.parity import ParityRecorder, ParityRun

D_MODEL, HIDDEN, OUT, BATCH, TOKENS = 8, 32, 4, 4, 3
STEPS, LR = 3, 0.1


def planted_tp_mlp(x, fc1, fc2, log):
    """Megatron's MLP on this rank's shards, with the planted bug: every rank uses all of ``x``, so the
    gradient of ``x`` is the sum of every rank's part; nothing sums them here."""
    hidden = F.gelu(fc1(x))                                    # my hidden features only
    partial = F.linear(hidden, fc2.weight)                     # my share of the block's output
    return reduce_from_parallel(partial, log, "fc2") + fc2.bias  # summed over ranks, the bias added once


class Net(nn.Module):
    """inp -> tanh -> mlp -> head. ``block``: None for one process, else a block function run on this
    rank's shards ``fc1``, ``fc2`` of the MLP (``tp`` = (rank, world_size))."""

    def __init__(self, seed: int = 0, block=None, tp: tuple[int, int] = (0, 1)):
        super().__init__()
        torch.manual_seed(seed)
        self.inp, self.head = nn.Linear(D_MODEL, D_MODEL), nn.Linear(D_MODEL, OUT)
        self.mlp = MLP(D_MODEL, HIDDEN, seed=seed + 1)
        self.block, self.log = block, AllReduceLog()
        if block is not None:
            self.mlp = _shards(self.mlp, *tp)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if self.block is None:
            return self.head(self.mlp(h))
        return self.head(self.block(h, self.mlp.fc1, self.mlp.fc2, self.log))


def _shards(full: MLP, rank: int, world_size: int) -> nn.Module:
    """This rank's shards of ``full``, under the same names: fc1's rows, fc2's columns and its whole bias."""
    rows = part(HIDDEN, rank, world_size, "the MLP's hidden layer")
    mine = nn.Module()
    mine.fc1, mine.fc2 = nn.Linear(D_MODEL, rows.stop - rows.start), nn.Linear(rows.stop - rows.start, D_MODEL)
    with torch.no_grad():
        mine.fc1.weight.copy_(full.fc1.weight[rows])
        mine.fc1.bias.copy_(full.fc1.bias[rows])
        mine.fc2.weight.copy_(full.fc2.weight[:, rows])
        mine.fc2.bias.copy_(full.fc2.bias)
    return mine


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s inputs and targets: every tensor-parallel rank sees the same batch."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, TOKENS, D_MODEL, generator=g), torch.randn(BATCH, TOKENS, OUT, generator=g)


def _steps(model: Net, recorder: ParityRecorder, steps: int) -> ParityRun:
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        recorder.record(step, model, loss)
        opt.step()
        opt.zero_grad()
    return recorder.run


def reference(steps: int = STEPS, seed: int = 0) -> ParityRun:
    """One process: ``steps`` SGD steps of ``Net``, its loss and gradients recorded at each."""
    return _steps(Net(seed), ParityRecorder(), steps)


def train(rank: int, world_size: int, block=planted_tp_mlp, steps: int = STEPS, seed: int = 0):
    """On each rank: the same steps with the MLP split over the ranks and computed by ``block``. Returns
    (the recorded run, the all_reduces the block made through ``log``: (layer, direction, bytes) each)."""
    shards = {"mlp.fc1.weight": (0, rank, world_size), "mlp.fc1.bias": (0, rank, world_size),
              "mlp.fc2.weight": (1, rank, world_size)}
    model = Net(seed, block, (rank, world_size))
    return _steps(model, ParityRecorder(shards=shards), steps), model.log.calls
