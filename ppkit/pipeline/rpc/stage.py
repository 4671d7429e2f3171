"""One pipeline stage: a shard of the model on one device, with its own compute thread.

The shard runs micro-batches on that one thread, one at a time and lowest (step, micro-batch)
first, like a CUDA stream, so RPC threads only queue work and never wait for it. Outputs wait in
the stage's outbox until the next stage pulls them. The RPC entry points that create, feed and
release stages are in ``ppkit.pipeline.rpc.stages``.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
import traceback

import torch
import torch.distributed.autograd as dist_autograd
from torch import nn

from ppkit.pipeline.rpc.resources import sync_threads

MAX_EVENTS = 100_000  # per stage; the driver drains them after every batch

# Builders draw initial weights from the global RNG: two stages built at once in one process
# (both shards on one worker) would interleave their draws and get different weights.
_build_lock = threading.Lock()


class _OnBackward(torch.autograd.Function):
    """Identity in forward; calls ``callback`` when its gradient passes in backward."""

    @staticmethod
    def forward(ctx, x, callback):
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.callback()
        return grad, None


def resnet_shard(index: int, cut: str, seed: int, num_classes: int = 1000,
                 dtype: torch.dtype | None = None) -> nn.Sequential:
    """Shard ``index`` (0 or 1) of ``ppkit.models.resnet.resnet50(seed)`` cut after ``cut``.

    Every process builds the same weights from the seed, so nothing large crosses the wire.
    """
    from ppkit.models.resnet import resnet50, split_resnet50

    shard = split_resnet50(resnet50(seed, num_classes), cut)[index]
    return shard if dtype is None else shard.to(dtype)


class Stage:
    """A shard on ``device`` with its own compute thread, outbox, timing log and optimizer."""

    def __init__(self, stage_id: str, index: int, builder, device: str):
        self.id = stage_id
        self.index = index
        self.device = torch.device(device)
        with _build_lock:
            self.module = builder().to(self.device)
        self.previous: tuple[str, str] | None = None  # (process, stage id) this stage pulls from
        self.optimizer = None
        # Lowest (step, micro-batch) first: RPC threads hand micro-batches over in whatever order
        # they happen to run, and the next stage needs them in order.
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._arrivals = itertools.count()
        self._lock = threading.Lock()
        self._outbox: dict[tuple[int, int], torch.futures.Future] = {}
        self._step = -1
        self._events: collections.deque = collections.deque(maxlen=MAX_EVENTS)
        self._backward_starts: dict[tuple[int, int], float] = {}
        self._on_first_op = None  # set while a micro-batch whose input needs no grad runs
        first_leaf = next((m for m in self.module.modules() if not list(m.children())), None)
        if first_leaf is not None:
            first_leaf.register_forward_hook(self._first_op_done)
        self._thread = threading.Thread(target=self._run, name=f"ppkit-stage{index}", daemon=True)
        self._thread.start()

    # -- compute thread ---------------------------------------------------------------------
    def submit(self, key: tuple[int, int], x: torch.Tensor, grad: bool) -> torch.futures.Future:
        """Queue micro-batch ``key = (step, microbatch)``; the Future gets this stage's output."""
        future = torch.futures.Future()
        self._jobs.put((key, next(self._arrivals), (x, grad, future)))
        return future

    def _run(self) -> None:
        while True:
            key, _, job = self._jobs.get()  # blocks without spinning: an idle stage costs no CPU
            if job is None:
                self._cancel_queued()
                return
            x, grad, future = job
            try:
                out = self._compute(key, x, grad)
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
                future.set_exception(_with_traceback(exc))
            else:
                future.set_result(out)

    def _cancel_queued(self) -> None:
        while not self._jobs.empty():
            key, _, job = self._jobs.get_nowait()
            if job is not None:
                job[2].set_exception(RuntimeError(
                    f"pipeline stage {self.index + 1} was released before micro-batch {key[1]} ran"))

    def _compute(self, key, x, grad):
        sync_threads()  # the stage's share of the cores (ppkit/pipeline/rpc/resources.py)
        start = time.time()
        with torch.set_grad_enabled(grad):
            x = x.to(self.device)
            if grad and x.requires_grad:
                x = _OnBackward.apply(x, lambda: self._backward_done(key))
            elif grad:
                self._on_first_op = lambda: self._backward_done(key)
            try:
                out = self.module(x)
            finally:
                self._on_first_op = None
            out = out.cpu()  # RPC sends CPU tensors unless device maps are configured
            if grad and out.requires_grad:
                out = _OnBackward.apply(out, lambda: self._backward_began(key))
        self._events.append((key[0], key[1], "forward", start, time.time()))
        return out

    def _first_op_done(self, module, inputs, output):
        # The shard's input needs no gradient (stage 1), so its backward ends when the gradient
        # of its first operation has been computed: hook that autograd node.
        done = self._on_first_op
        if done is not None and isinstance(output, torch.Tensor) and output.grad_fn is not None:
            output.grad_fn.register_hook(lambda grad_inputs, grad_outputs: done())

    def _backward_began(self, key) -> None:
        sync_threads()  # on the thread that runs this process's backward
        with self._lock:
            self._backward_starts[key] = time.time()

    def _backward_done(self, key) -> None:
        end = time.time()
        with self._lock:
            start = self._backward_starts.pop(key, end)
        self._events.append((key[0], key[1], "backward", start, end))

    # -- outbox: outputs wait here until the next stage pulls them ----------------------------
    def outbox_slot(self, key) -> torch.futures.Future:
        """Where micro-batch ``key``'s output waits: ``stages.run`` fills it, :meth:`take` reads it."""
        with self._lock:
            if key[0] > self._step:  # a new step: drop anything a failed step left behind
                self._step = key[0]
                for old in [k for k in self._outbox if k[0] < key[0]]:
                    del self._outbox[old]
            future = self._outbox.get(key)
            if future is None:
                future = self._outbox[key] = torch.futures.Future()
            return future

    def take(self, key) -> torch.futures.Future:
        def handed_over(future):
            with self._lock:
                self._outbox.pop(key, None)
            return future.value()

        return self.outbox_slot(key).then(handed_over)

    # -- timing, training ----------------------------------------------------------------------
    def drain_events(self) -> list[tuple]:
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def accumulate_gradients(self, context_id: int) -> None:
        """Add the shard's gradients of ``context_id`` to its ``.grad``: a step whose micro-batches
        each ran in a context of their own (``ppkit.pipeline.rpc.no_overlap``)."""
        grads = dist_autograd.get_gradients(context_id)
        for p in self.module.parameters():
            if p in grads:
                p.grad = grads[p].clone() if p.grad is None else p.grad.add_(grads[p])

    def optimizer_step(self, context_id: int | None) -> None:
        """Step with the gradients of ``context_id``, or (``None``) with those accumulated."""
        if context_id is None:
            params = [p for p in self.module.parameters() if p.grad is not None]
        else:
            grads = dist_autograd.get_gradients(context_id)
            params = [p for p in self.module.parameters() if p in grads]
            for p in params:
                p.grad = grads[p]
        self.optimizer.step()
        for p in params:
            p.grad = None

    def close(self) -> None:
        self._jobs.put(((-1, -1), next(self._arrivals), None))  # ahead of any queued work


def _with_traceback(exc: BaseException) -> BaseException:
    """Keep the stage's traceback in the message: RPC sends only the exception's text."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        return type(exc)(f"{exc}\n\nTraceback on the stage:\n{text}")
    except Exception:  # noqa: BLE001 - exception types with unusual constructors
        return RuntimeError(f"{type(exc).__name__}: {exc}\n\nTraceback on the stage:\n{text}")
