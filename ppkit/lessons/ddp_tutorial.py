"""The shape of the PyTorch tutorial "Getting Started with Distributed Data Parallel", run with ppkit.spawn.

The tutorial (pytorch/tutorials, intermediate_source/ddp_tutorial.rst) defines ``setup``/``cleanup``
around ``init_process_group("gloo")`` on a fixed MASTER_PORT 12355, a ``ToyModel``, three demos
(``demo_basic``, ``demo_checkpoint``, ``demo_model_parallel`` with a ``ToyMpModel``) and a
``run_demo`` that calls ``mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)``.
The block between the two ``# ---`` markers is written here in that shape, with the same names,
port and calls, so that a learner recognises the tutorial and can paste its own copy the same way;
it is this project's text, not a copy. What differs from the tutorial, on purpose:

- ``run_demo`` calls ``ppkit.spawn`` where the tutorial calls ``mp.spawn`` (the same arguments):
  mp.spawn cannot run functions defined in a notebook cell;
- the devices are the CPU: where the tutorial moves the model to GPU ``rank`` and passes
  ``device_ids``, this keeps the model on the CPU and calls ``DDP(model)`` (DDP refuses
  ``device_ids`` for a CPU module); the model-parallel demo's two devices are both "cpu".

Notebook 03 pastes the same block into a cell (a test checks that the two stay equal) and calls
``run_demo`` twice for each demo. Run it as a script, so that its functions live in ``__main__``
exactly as in a notebook cell:

    python -m ppkit.lessons.ddp_tutorial      # each demo twice on 2 processes
"""

# --- the tutorial's code ---
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

import ppkit


def setup(rank, world_size):
    # every process meets at a fixed address and port, as the tutorial does
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def train_one_step(model, device="cpu"):
    """One SGD step on random data: DDP averages the gradients over the ranks in backward()."""
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    optimizer.zero_grad()
    outputs = model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(device)
    nn.MSELoss()(outputs, labels).backward()
    optimizer.step()


def demo_basic(rank, world_size):
    print(f"basic DDP demo on rank {rank}")
    setup(rank, world_size)
    ddp_model = DDP(ToyModel().to("cpu"))  # on GPUs: ToyModel().to(rank), DDP(model, device_ids=[rank])
    train_one_step(ddp_model)
    cleanup()


def run_demo(demo_fn, world_size):
    ppkit.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)  # the tutorial: mp.spawn


def demo_checkpoint(rank, world_size):
    print(f"DDP checkpoint demo on rank {rank}")
    setup(rank, world_size)
    ddp_model = DDP(ToyModel().to("cpu"))
    path = os.path.join(tempfile.gettempdir(), "model.checkpoint")
    if rank == 0:  # the ranks hold equal weights, so one of them saves
        torch.save(ddp_model.state_dict(), path)
    dist.barrier()  # the others load only once rank 0 has saved
    ddp_model.load_state_dict(torch.load(path, map_location="cpu"))  # on GPUs: map cuda:0 to cuda:rank
    train_one_step(ddp_model)
    if rank == 0:  # backward's all_reduce already synchronised the ranks: no barrier needed
        os.remove(path)
    cleanup()


class ToyMpModel(nn.Module):
    """ToyModel split over two devices (two GPUs in the tutorial; both the CPU here)."""

    def __init__(self, dev0, dev1):
        super().__init__()
        self.dev0, self.dev1 = dev0, dev1
        self.net1 = nn.Linear(10, 10).to(dev0)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = self.relu(self.net1(x.to(self.dev0)))
        return self.net2(x.to(self.dev1))


def demo_model_parallel(rank, world_size):
    print(f"DDP with model parallel demo on rank {rank}")
    setup(rank, world_size)
    dev0, dev1 = "cpu", "cpu"  # on GPUs: rank * 2 and rank * 2 + 1
    ddp_mp_model = DDP(ToyMpModel(dev0, dev1))  # no device_ids for a module on several devices
    train_one_step(ddp_mp_model, dev1)
    cleanup()
# ---

DEMOS = ("demo_basic", "demo_checkpoint", "demo_model_parallel")


def tutorial_source() -> str:
    """The block between the markers: what notebook 03 pastes into a cell."""
    import inspect

    text = inspect.getsource(sys.modules[__name__])
    start = text.index("# --- the tutorial's code ---\n") + len("# --- the tutorial's code ---\n")
    return text[start:text.index("\n# ---\n", start)].strip("\n")


if __name__ == "__main__":
    world_size = 2
    for _ in range(2):
        run_demo(demo_basic, world_size)
        run_demo(demo_checkpoint, world_size)
        run_demo(demo_model_parallel, world_size)
    print(f"each demo ran twice on {world_size} processes")
