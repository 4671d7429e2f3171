"""Lesson 04's teaching code: remote modules, distributed autograd, two ways to optimise.

Everything here is defined in a module (not a notebook cell), so RPC can send it by reference.
"""

from __future__ import annotations

import threading
import time

import torch
from torch import nn
from torch.distributed import autograd as dist_autograd
from torch.distributed import rpc
from torch.distributed.rpc import RRef

from ppkit.errors import ConfigError


class RemoteLinear(nn.Module):
    """An ``nn.Linear`` meant to live on a worker, with what the master needs to train it.

    ``step(context_id)`` is the per-worker optimizer pattern: each owner reads the gradients
    that distributed autograd stored on its node and steps its own ``torch.optim.SGD``.
    """

    def __init__(self, in_features: int, out_features: int, seed: int, lr: float = 0.1):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.linear = nn.Linear(in_features, out_features)
        self.optimizer = torch.optim.SGD(self.parameters(), lr=lr)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def parameter_rrefs(self) -> list[RRef]:
        return [RRef(p) for p in self.parameters()]

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.state_dict().items()}

    def grads(self, context_id: int) -> dict[str, torch.Tensor]:
        """The gradients distributed autograd computed for this module in ``context_id``."""
        found = dist_autograd.get_gradients(context_id)
        return {name: found[p].clone() for name, p in self.named_parameters() if p in found}

    def step(self, context_id: int) -> None:
        found = dist_autograd.get_gradients(context_id)
        for p in self.parameters():
            p.grad = found.get(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def local_copy(seeds: tuple[int, int], sizes: tuple[int, int, int] = (4, 8, 2)) -> nn.Sequential:
    """The same two layers as ``build_remote_mlp`` would make, in this process."""
    first = RemoteLinear(sizes[0], sizes[1], seeds[0])
    second = RemoteLinear(sizes[1], sizes[2], seeds[1])
    return nn.Sequential(first, nn.ReLU(), second)


def build_remote_mlp(owners: tuple[str, str], seeds: tuple[int, int] = (1, 2),
                     sizes: tuple[int, int, int] = (4, 8, 2)) -> tuple[RRef, RRef]:
    """Two ``RemoteLinear`` layers, one on each owner; returns their RRefs."""
    first = rpc.remote(owners[0], RemoteLinear, args=(sizes[0], sizes[1], seeds[0]))
    second = rpc.remote(owners[1], RemoteLinear, args=(sizes[1], sizes[2], seeds[1]))
    return first, second


def remote_forward(layers: tuple[RRef, RRef], x: torch.Tensor) -> torch.Tensor:
    """x -> layer 1 (on its owner) -> ReLU (here) -> layer 2 (on its owner)."""
    hidden = layers[0].rpc_sync().forward(x)
    return layers[1].rpc_sync().forward(torch.relu(hidden))


def remote_grads(layers, context_id: int) -> list[dict[str, torch.Tensor]]:
    return [layer.rpc_sync().grads(context_id) for layer in layers]


def remote_step(layers, context_id: int) -> None:
    """The per-worker optimizer pattern: ask each owner to step its own optimizer."""
    futures = [layer.rpc_async().step(context_id) for layer in layers]
    torch.futures.wait_all(futures)


def remote_state(layers) -> list[dict[str, torch.Tensor]]:
    return [layer.rpc_sync().state() for layer in layers]


def seconds_until_done(fn, deadline: float) -> float | None:
    """Call ``fn()`` in a background thread: the seconds it took, or ``None`` if it still runs
    after ``deadline`` seconds (it is left running; restart the RPC world to end it).

    Notebook 04 times the tutorial's shards with too few RPC threads, which never return: the
    cell must not hang with them. An exception raised before the deadline is raised here.
    """
    outcome: list = []

    def target():
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001  (raised in the caller, or dropped if late)
            outcome.append(exc)

    started = time.perf_counter()
    thread = threading.Thread(target=target, daemon=True, name="ppkit-timed-call")
    thread.start()
    thread.join(deadline)
    if not outcome:
        return None
    if outcome[0] is not None:
        raise outcome[0]
    return time.perf_counter() - started


# -- the exercise ---------------------------------------------------------------------------
def _make_tensor(shape, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator)


def check_remote_sum(remote_sum, owners: list[str]) -> str:
    """Check a learner's ``remote_sum(rrefs) -> tensor`` on RRefs owned by ``owners``.

    Raises ``AssertionError`` naming the case that went wrong; returns a summary when all pass.
    """
    if not callable(remote_sum):
        raise ConfigError("check_remote_sum needs your function, e.g. check_remote_sum(remote_sum, names)")
    if not owners:
        raise ConfigError("check_remote_sum needs at least one worker name to put tensors on")
    cases = [((3,), 1), ((2, 2), len(owners)), ((5,), 2 * len(owners) + 1)]
    for case, (shape, count) in enumerate(cases, 1):
        tensors = [_make_tensor(shape, 100 * case + i) for i in range(count)]
        rrefs = [rpc.remote(owners[i % len(owners)], torch.clone, args=(t,))
                 for i, t in enumerate(tensors)]
        where = ", ".join(owners[i % len(owners)] for i in range(count))
        expected = torch.stack(tensors).sum(0)
        got = remote_sum(rrefs)
        if not isinstance(got, torch.Tensor):
            raise AssertionError(
                f"case {case} ({count} tensors of shape {shape} on {where}): remote_sum returned "
                f"{type(got).__name__}, expected a tensor. Fetch each value (rref.to_here()) "
                "and add them up.")
        if got.shape != expected.shape or not torch.allclose(got, expected, atol=1e-6):
            raise AssertionError(
                f"case {case} ({count} tensors of shape {shape} on {where}): expected\n"
                f"{expected}\ngot\n{got}")
    return f"remote_sum passed {len(cases)} cases with RRefs owned by {', '.join(owners)}"
