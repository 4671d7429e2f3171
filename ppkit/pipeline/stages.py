"""One pipeline stage: a shard of the model on one RPC process and one device.

Why a stage never blocks an RPC thread (the tutorial's shard does, and deadlocks): the tutorial's
``forward(x_rref)`` calls ``x_rref.to_here()`` inside the RPC handler. That holds one of the
process's RPC threads for as long as the previous stage needs to produce that micro-batch, so with
16 threads and 16+ micro-batches in flight every thread waits and nothing is left to deliver the
answers they wait for. Here every RPC entry point is ``@rpc.functions.async_execution``: it queues
work and returns a Future at once, and the RPC thread is free again. The shard itself runs on one
compute thread per stage (like a CUDA stream: micro-batches run one at a time, in arrival order),
and a stage *pulls* its input from the previous stage with a nested ``rpc_async`` whose answer
comes when that micro-batch is ready. No RPC thread ever waits, so any number of micro-batches
works with the default 16 threads.

Why pull rather than push: a nested RPC carries the distributed-autograd context only when it is
issued from the RPC handler (the handler runs inside the caller's context; the compute thread
does not). Pulling from the handler keeps every hop in the context, so ``dist_autograd.backward``
reaches every shard.
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import queue
import threading
import time
import traceback

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn

from ppkit.pipeline.resources import sync_threads

MAX_EVENTS = 100_000  # per stage; the driver drains them after every batch

# Stages living in this process, by id. The driver (PipelineModel) creates and releases them.
_stages: dict[str, "Stage"] = {}
_stages_lock = threading.Lock()
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
        sync_threads()  # the stage's share of the cores (ppkit/pipeline/resources.py)
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
    def _slot(self, key) -> torch.futures.Future:
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

        return self._slot(key).then(handed_over)

    # -- timing, training ----------------------------------------------------------------------
    def drain_events(self) -> list[tuple]:
        events = []
        while self._events:
            events.append(self._events.popleft())
        return events

    def optimizer_step(self, context_id: int) -> None:
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


def _get(stage_id: str) -> Stage:
    with _stages_lock:
        stage = _stages.get(stage_id)
    if stage is None:
        raise RuntimeError(
            f"pipeline stage {stage_id} is not on {rpc.get_worker_info().name}: it was released "
            "(model closed) or this process was restarted. Build the pipeline model again.")
    return stage


def _copy_into(target: torch.futures.Future):
    def copy(source):
        try:
            target.set_result(source.value())
        except BaseException as exc:  # noqa: BLE001
            target.set_exception(exc)
    return copy


# -- RPC entry points (called by PipelineModel; pickled by reference, so they live here) ----------

def probe(modules: list[str]) -> dict:
    """What the driver needs to know before placing a shard here: devices and missing modules."""
    missing = {}
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                missing[name] = f"No module named {name!r}"
        except Exception as exc:  # noqa: BLE001 - a broken package counts as missing
            missing[name] = f"{type(exc).__name__}: {exc}"
    return {"cuda": torch.cuda.device_count(), "missing": missing, "torch": torch.__version__}


def create(stage_id: str, index: int, builder, device: str, previous) -> str:
    stage = Stage(stage_id, index, builder, device)
    stage.previous = previous
    with _stages_lock:
        _stages[stage_id] = stage
    return stage_id


def release(stage_ids: list[str]) -> None:
    for stage_id in stage_ids:
        with _stages_lock:
            stage = _stages.pop(stage_id, None)
        if stage is not None:
            stage.close()


@rpc.functions.async_execution
def run(stage_id: str, key: tuple[int, int], x, grad: bool, keep: bool, timeout: float):
    """Run micro-batch ``key`` through this stage.

    ``x`` is the input tensor for the first stage and ``None`` for the others, which pull their
    input from the previous stage. ``keep``: store the output for the next stage and answer
    ``None``; otherwise answer the output itself (the last stage).
    """
    stage = _get(stage_id)
    result = torch.futures.Future()
    slot = stage._slot(key) if keep else None

    def finish(future):
        try:
            out = future.value()
        except BaseException as exc:  # noqa: BLE001
            if slot is not None:
                slot.set_exception(exc)
            result.set_exception(exc)
            return
        if slot is not None:
            slot.set_result(out)
            result.set_result(None)
        else:
            result.set_result(out)

    def compute(future):
        try:
            x_in = future.value()
        except BaseException as exc:  # noqa: BLE001
            finish(_failed(exc))
            return
        stage.submit(key, x_in, grad).add_done_callback(finish)

    if x is not None:
        stage.submit(key, x, grad).add_done_callback(finish)
    else:
        process, previous_id = stage.previous
        # Issued here, in the handler, so it carries the caller's distributed-autograd context.
        rpc.rpc_async(process, take, args=(previous_id, key), timeout=timeout).add_done_callback(compute)
    return result.then(_value)


def _value(future):
    # A Python future's set_exception() stores the exception as its *value*, and RPC would send
    # that value back as if it were a result. Reading it here raises it, and the future this
    # callback completes carries a real error, which RPC sends as one.
    return future.value()


def _failed(exc: BaseException) -> torch.futures.Future:
    future = torch.futures.Future()
    future.set_exception(exc)
    return future


@rpc.functions.async_execution
def take(stage_id: str, key: tuple[int, int]):
    """The next stage's pull: answers when micro-batch ``key`` has left this stage."""
    return _get(stage_id).take(key)


def drain_events(stage_id: str) -> list[tuple]:
    return _get(stage_id).drain_events()


def set_train(stage_id: str, mode: bool) -> None:
    _get(stage_id).module.train(mode)


def make_optimizer(stage_id: str, optimizer_class, kwargs: dict) -> None:
    stage = _get(stage_id)
    stage.optimizer = optimizer_class(stage.module.parameters(), **kwargs)


def optimizer_step(stage_id: str, context_id: int) -> None:
    _get(stage_id).optimizer_step(context_id)


def state_dict(stage_id: str) -> dict:
    return {k: v.detach().cpu() for k, v in _get(stage_id).module.state_dict().items()}


def gradients(stage_id: str, context_id: int) -> dict:
    grads = dist_autograd.get_gradients(context_id)
    module = _get(stage_id).module
    return {name: grads[p].cpu() for name, p in module.named_parameters() if p in grads}


def parameter_rrefs(stage_id: str) -> list:
    return [rpc.RRef(p) for p in _get(stage_id).module.parameters()]
