"""The code of the PyTorch tutorial "Getting Started with Distributed Data Parallel", as written.

From pytorch/tutorials, ``intermediate_source/ddp_tutorial.rst`` (BSD-3-Clause): its set-up,
``ToyModel``, ``demo_basic``, ``demo_checkpoint``, ``ToyMpModel``, ``demo_model_parallel`` and
``run_demo``, pasted unchanged between the two ``# ---`` markers but for three edits:

- ``import ppkit``, and ``run_demo`` calls ``ppkit.spawn`` where the tutorial calls ``mp.spawn``
  (the same arguments): mp.spawn cannot run functions defined in a notebook cell;
- the devices are the CPU: ``.to("cpu")`` where the tutorial moves to GPU ``rank``, ``DDP(model)``
  without ``device_ids`` (DDP refuses them for a CPU module), and ``dev0``/``dev1`` = ``"cpu"``;
- the ``if __name__ == "__main__"`` block, which counts GPUs, is replaced by the calls below.

Notebook 03 pastes the same block into a cell (a test checks that the two stay equal) and calls
``run_demo`` twice for each demo. Run it as a script, so that its functions live in ``__main__``
exactly as in a notebook cell:

    python -m ppkit.lessons.ddp_tutorial      # each demo twice on 2 processes
"""
# The block is the tutorial's text, kept as written: its import order, unused imports and
# super(Class, self) calls too.
# ruff: noqa: I001, F401

# --- the tutorial's code ---
import os
import sys
import tempfile
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import torch.multiprocessing as mp

from torch.nn.parallel import DistributedDataParallel as DDP

import ppkit

# On Windows platform, the torch.distributed package only
# supports Gloo backend, FileStore and TcpStore.
# For FileStore, set init_method parameter in init_process_group
# to a local file. Example as follow:
# init_method="file:///f:/libtmp/some_file"
# dist.init_process_group(
#    "gloo",
#    rank=rank,
#    init_method=init_method,
#    world_size=world_size)
# For TcpStore, same way as on Linux.

def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    # initialize the process group
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

def cleanup():
    dist.destroy_process_group()

class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)

    # create model and move it to GPU with id rank
    model = ToyModel().to("cpu")
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to("cpu")
    loss_fn(outputs, labels).backward()
    optimizer.step()

    cleanup()


def run_demo(demo_fn, world_size):
    ppkit.spawn(demo_fn,
                args=(world_size,),
                nprocs=world_size,
                join=True)

def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)

    model = ToyModel().to("cpu")
    ddp_model = DDP(model)


    CHECKPOINT_PATH = tempfile.gettempdir() + "/model.checkpoint"
    if rank == 0:
        # All processes should see same parameters as they all start from same
        # random parameters and gradients are synchronized in backward passes.
        # Therefore, saving it in one process is sufficient.
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # Use a barrier() to make sure that process 1 loads the model after process
    # 0 saves it.
    dist.barrier()
    # configure map_location properly
    map_location = {'cuda:%d' % 0: 'cuda:%d' % rank}
    ddp_model.load_state_dict(
        torch.load(CHECKPOINT_PATH, map_location=map_location))

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to("cpu")

    loss_fn(outputs, labels).backward()
    optimizer.step()

    # Not necessary to use a dist.barrier() to guard the file deletion below
    # as the AllReduce ops in the backward pass of DDP already served as
    # a synchronization.

    if rank == 0:
        os.remove(CHECKPOINT_PATH)

    cleanup()

class ToyMpModel(nn.Module):
    def __init__(self, dev0, dev1):
        super(ToyMpModel, self).__init__()
        self.dev0 = dev0
        self.dev1 = dev1
        self.net1 = torch.nn.Linear(10, 10).to(dev0)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(10, 5).to(dev1)

    def forward(self, x):
        x = x.to(self.dev0)
        x = self.relu(self.net1(x))
        x = x.to(self.dev1)
        return self.net2(x)

def demo_model_parallel(rank, world_size):
    print(f"Running DDP with model parallel example on rank {rank}.")
    setup(rank, world_size)

    # setup mp_model and devices for this process
    dev0 = "cpu"
    dev1 = "cpu"
    mp_model = ToyMpModel(dev0, dev1)
    ddp_mp_model = DDP(mp_model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_mp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    # outputs will be on dev1
    outputs = ddp_mp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(dev1)
    loss_fn(outputs, labels).backward()
    optimizer.step()

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
