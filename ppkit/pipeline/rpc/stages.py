"""The RPC entry points of pipeline stages: create, feed, drain and release the stages of a process.

Why a stage never blocks an RPC thread (the tutorial's shard does, and deadlocks): the tutorial's
``forward(x_rref)`` calls ``x_rref.to_here()`` inside the RPC handler. That holds one of the
process's RPC threads for as long as the previous stage needs to produce that micro-batch, so with
16 threads and 16+ micro-batches in flight every thread waits and nothing is left to deliver the
answers they wait for. Here every RPC entry point is ``@rpc.functions.async_execution``: it queues
work and returns a Future at once, and the RPC thread is free again. The shard itself runs on one
compute thread per stage (``ppkit.pipeline.rpc.stage``; micro-batches run one at a time, in order),
and a stage *pulls* its input from the previous stage with a nested ``rpc_async`` whose answer
comes when that micro-batch is ready. No RPC thread ever waits, so any number of micro-batches
works with the default 16 threads.

Why pull rather than push: a nested RPC carries the distributed-autograd context only when it is
issued from the RPC handler (the handler runs inside the caller's context; the compute thread
does not). Pulling from the handler keeps every hop in the context, so ``dist_autograd.backward``
reaches every shard.
"""

from __future__ import annotations

import importlib.util
import threading

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc

from ppkit.pipeline.rpc.stage import Stage

# Stages living in this process, by id. The driver (PipelineModel) creates and releases them.
_stages: dict[str, Stage] = {}
_stages_lock = threading.Lock()


def _get(stage_id: str) -> Stage:
    with _stages_lock:
        stage = _stages.get(stage_id)
    if stage is None:
        raise RuntimeError(
            f"pipeline stage {stage_id} is not on {rpc.get_worker_info().name}: it was released "
            "(model closed) or this process was restarted. Build the pipeline model again.")
    return stage


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
    slot = stage.outbox_slot(key) if keep else None

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


def set_tf32(enabled: bool) -> tuple[bool, bool]:
    """Let (or stop) this process's CUDA convolutions and matmuls use TF32; returns the previous
    ``(cudnn, matmul)`` settings. TF32 (on by default for cuDNN) rounds inputs to 10 mantissa bits:
    outputs then differ from a float32 CPU run by ~1e-2, which is TF32, not the pipeline."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = enabled
    return before


def restore_tf32(before: tuple[bool, bool]) -> None:
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def make_optimizer(stage_id: str, optimizer_class, kwargs: dict) -> None:
    stage = _get(stage_id)
    stage.optimizer = optimizer_class(stage.module.parameters(), **kwargs)


def optimizer_step(stage_id: str, context_id: int | None) -> None:
    _get(stage_id).optimizer_step(context_id)


def accumulate_gradients(stage_id: str, context_id: int) -> None:
    _get(stage_id).accumulate_gradients(context_id)


def state_dict(stage_id: str) -> dict:
    return {k: v.detach().cpu() for k, v in _get(stage_id).module.state_dict().items()}


def gradients(stage_id: str, context_id: int) -> dict:
    grads = dist_autograd.get_gradients(context_id)
    module = _get(stage_id).module
    return {name: grads[p].cpu() for name, p in module.named_parameters() if p in grads}


def parameter_rrefs(stage_id: str) -> list:
    return [rpc.RRef(p) for p in _get(stage_id).module.parameters()]
