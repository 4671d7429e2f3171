"""The pipeline model: micro-batches sent through shards on RPC processes, as in the tutorial.

    world = ppkit.start_rpc(2)
    model = PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=4)
    optimizer = PipelineOptimizer(model, torch.optim.SGD, lr=0.05)
    with dist_autograd.context() as context_id:
        loss = loss_fn(model(inputs), labels)
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)

Every shard is built on its own process from a seed (``resnet50(seed)`` split at ``cut``), so the
pipeline computes exactly what a local ``ppkit.models.resnet.resnet50(seed)`` computes.
"""

from __future__ import annotations

import functools
import itertools
import uuid
import weakref

import torch
import torch.distributed.rpc as rpc
from torch import nn

from ppkit.checks import positive
from ppkit.errors import ClusterStateError, ConfigError, StageError
from ppkit.models.resnet import DEFAULT_CUT, check_cut
from ppkit.pipeline import stages
from ppkit.pipeline.config import (
    Placement,
    check_microbatch_size,
    check_placement,
    item_list,
    parse_placement,
)

# What every process holding a stage must be able to import.
REQUIRED_MODULES = ("torch", "torchvision", "ppkit.pipeline.stages")


def _rpc_names() -> list[str]:
    if not rpc.api._is_current_rpc_agent_set():
        raise ClusterStateError(
            "no RPC world in this process: start one with world = ppkit.start_rpc(num_workers=2) "
            "before building a pipeline model.")
    agent = rpc.api._get_current_rpc_agent()
    return [info.name for info in sorted(agent.get_worker_infos(), key=lambda info: info.id)]


def _in_dist_autograd_context() -> bool:
    try:
        torch.distributed.autograd._current_context()
    except RuntimeError:
        return False
    return True


def _module_of(builder) -> str | None:
    while isinstance(builder, functools.partial):
        builder = builder.func
    name = getattr(builder, "__module__", None)
    return name if name and name != "__main__" else None


_NOISE = ("Got the following error when running the callback: ",)


def _short(exc: BaseException) -> str:
    """The first line of an error that crossed RPC, without torch's wrapping."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    for noise in _NOISE:
        line = line.replace(noise, "")
    return line


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timeout" in text or "timed out" in text


class PipelineModel(nn.Module):
    """A model cut into shards, one per ``placement`` entry, run as a GPipe-style pipeline.

    ``placement``: one ``NAME:DEVICE`` per shard (``"worker1:cpu,worker2:cpu"``; ``master`` is
    this process). ``microbatch_size``: images per micro-batch (``None``: the whole batch, i.e.
    plain model parallelism). ``shards``: zero-argument callables that build each shard on its
    process (default: ResNet50 cut after ``cut`` with weights from ``seed``, in ``dtype``; float64
    makes exact comparisons possible). ``timeout``: seconds before an unanswered stage counts as
    failed (default: the RPC world's timeout).

    Needs an RPC world in this process (``ppkit.start_rpc``). Checks the placement against it
    (names, devices, importable modules) before building anything.
    """

    def __init__(self, placement="worker1:cpu,worker2:cpu", *, microbatch_size: int | None = None,
                 cut: str = DEFAULT_CUT, seed: int = 0, num_classes: int = 1000, shards=None,
                 dtype: torch.dtype | None = None, timeout: float | None = None):
        super().__init__()
        self.placement: tuple[Placement, ...] = parse_placement(placement)
        if shards is None:
            check_cut(cut)
            shards = [functools.partial(stages.resnet_shard, i, cut, seed, num_classes, dtype)
                      for i in range(len(self.placement))]
            if len(self.placement) != 2:
                raise ConfigError(
                    f"ResNet50 is cut into 2 shards, but the placement names {len(self.placement)} "
                    f"({item_list(self.placement)}): give one NAME:DEVICE per shard.")
        shards = list(shards)
        if len(shards) != len(self.placement):
            raise ConfigError(
                f"{len(shards)} shards but {len(self.placement)} placements "
                f"({item_list(self.placement)}): give one NAME:DEVICE per shard.")
        if microbatch_size is not None:
            check_microbatch_size(microbatch_size, microbatch_size)
        if timeout is not None:
            positive(timeout, "timeout")
        self.cut = cut
        self.seed = seed
        self.num_classes = num_classes
        self.microbatch_size = microbatch_size
        self.timeout = timeout
        self._rpc_timeout = rpc.constants.UNSET_RPC_TIMEOUT if timeout is None else timeout
        self._steps = itertools.count()
        self._ids: list[str] = []
        self.resources: list = []  # what each stage process got (sweep.build_model sets it)
        self._check_world(shards)
        self._build(shards)
        self._finalizer = weakref.finalize(self, _release, self._processes_and_ids())
        self._finalizer.atexit = False  # at interpreter exit the RPC world may be gone already

    # -- building ------------------------------------------------------------------------------
    def _check_world(self, shards) -> None:
        names = _rpc_names()
        check_placement(self.placement, names)  # names first: probing needs them to exist
        modules = {}
        for placement, builder in zip(self.placement, shards):
            extra = _module_of(builder)
            modules.setdefault(placement.process, set(REQUIRED_MODULES))
            if extra:
                modules[placement.process].add(extra)
        futures = {process: rpc.rpc_async(process, stages.probe, args=(sorted(needed),),
                                          timeout=self._rpc_timeout)
                   for process, needed in modules.items()}
        devices = {}
        for process, future in futures.items():
            stage = next(i for i, p in enumerate(self.placement) if p.process == process)
            try:
                report = future.wait()
            except Exception as exc:
                raise StageError(
                    f"{process} could not run ppkit's stage code: {_short(exc)}. Check that ppkit, "
                    f"torch and torchvision are installed where {process} runs (the same versions "
                    "as here: ppkit version).", stage=stage, process=process) from exc
            for module, reason in report["missing"].items():
                raise StageError(
                    f"{process} cannot import {module!r}, which shard {stage + 1} needs ({reason}). "
                    f"Install it on {process}'s machine, or define the shard in the notebook and "
                    "ship it by value with ppkit.by_value(...).", stage=stage, process=process)
            devices[process] = report["cuda"]
        check_placement(self.placement, names, devices)

    def _build(self, shards) -> None:
        prefix = uuid.uuid4().hex[:12]
        self._ids = [f"{prefix}-{i}" for i in range(len(shards))]
        futures = []
        for i, (placement, builder) in enumerate(zip(self.placement, shards)):
            previous = None if i == 0 else (self.placement[i - 1].process, self._ids[i - 1])
            futures.append(rpc.rpc_async(
                placement.process, stages.create,
                args=(self._ids[i], i, builder, placement.device, previous), timeout=self._rpc_timeout))
        errors = []
        for i, future in enumerate(futures):
            try:
                future.wait()
            except Exception as exc:  # noqa: BLE001 - reported below, after every build finished
                errors.append((i, exc))
        if errors:
            _release(self._processes_and_ids())
            i, exc = errors[0]
            process = self.placement[i].process
            raise StageError(
                f"could not build shard {i + 1} on {process} ({self.placement[i].device}): {_short(exc)}",
                stage=i, process=process) from exc

    def _processes_and_ids(self) -> list[tuple[str, str]]:
        return [(p.process, stage_id) for p, stage_id in zip(self.placement, self._ids)]

    def _check_open(self) -> None:
        if not self._ids:
            raise ClusterStateError("this pipeline model is closed: build a new PipelineModel.")

    # -- running -------------------------------------------------------------------------------
    def num_microbatches(self, batch_size: int) -> int:
        size = self.microbatch_size or batch_size
        return -(-batch_size // size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Split ``x`` into micro-batches and pipeline them through the shards.

        Inside ``dist_autograd.context()`` (with grad enabled) the shards record autograd for
        ``dist_autograd.backward``; outside, they run without gradients.
        """
        self._check_open()
        batch_size = x.shape[0]
        size = batch_size if self.microbatch_size is None else self.microbatch_size
        check_microbatch_size(size, batch_size)
        grad = torch.is_grad_enabled() and _in_dist_autograd_context()
        step = next(self._steps)
        last = len(self._ids) - 1
        calls = []
        for mb, chunk in enumerate(x.split(size)):
            calls.append([
                rpc.rpc_async(p.process, stages.run,
                              args=(stage_id, (step, mb), chunk if i == 0 else None, grad, i < last,
                                    self._rpc_timeout),
                              timeout=self._rpc_timeout)
                for i, (p, stage_id) in enumerate(zip(self.placement, self._ids))])
        return torch.cat(self._gather(calls))

    def _gather(self, calls) -> list[torch.Tensor]:
        # Wait for every call, even after a failure, so nothing is left running behind the error.
        outputs, errors = [], []
        for mb, per_stage in enumerate(calls):
            for i, future in enumerate(per_stage):
                try:
                    value = future.wait()
                except Exception as exc:  # noqa: BLE001
                    errors.append((i, mb, exc))
                    continue
                if i == len(per_stage) - 1:
                    outputs.append(value)
        if errors:
            i, mb, exc = min(errors, key=lambda e: (e[0], e[1]))  # the earliest stage to fail
            p = self.placement[i]
            where = f"stage {i + 1} ({p.process}:{p.device})"
            if _is_timeout(exc):
                limit = f"{self.timeout:g} s" if self.timeout else "the RPC world's timeout"
                what = (f"{where} did not answer within {limit} on micro-batch {mb} of {len(calls)}. "
                        "It may still be busy: world.restart() gives fresh processes.")
            else:
                what = (f"{where} failed: {_short(exc)} (micro-batch {mb} of {len(calls)}). The "
                        "stage's traceback is in this error's __cause__; the model stays usable.")
            raise StageError(what, stage=i, process=p.process, microbatch=mb) from exc
        return outputs

    def _call_all(self, fn, *args, what: str) -> list:
        self._check_open()
        futures = [rpc.rpc_async(p.process, fn, args=(stage_id, *args), timeout=self._rpc_timeout)
                   for p, stage_id in zip(self.placement, self._ids)]
        results = []
        for i, future in enumerate(futures):
            try:
                results.append(future.wait())
            except Exception as exc:
                p = self.placement[i]
                raise StageError(f"{what} failed on stage {i + 1} ({p}): {_short(exc)}",
                                 stage=i, process=p.process) from exc
        return results

    def train(self, mode: bool = True) -> "PipelineModel":
        """Set train/eval mode (BatchNorm!) on every shard."""
        super().train(mode)
        if self._ids:
            self._call_all(stages.set_train, bool(mode), what="setting train mode")
        return self

    def parameter_rrefs(self) -> list[rpc.RRef]:
        """One RRef per parameter of every shard, for ``DistributedOptimizer``."""
        return [rref for per_stage in self._call_all(stages.parameter_rrefs, what="parameter_rrefs")
                for rref in per_stage]

    def state_dicts(self) -> list[dict]:
        """Each shard's ``state_dict`` (CPU copies), keyed as in ``split_resnet50``'s shards."""
        return self._call_all(stages.state_dict, what="state_dict")

    def gradients(self, context_id: int) -> list[dict]:
        """Each shard's gradients in distributed-autograd context ``context_id``, by name."""
        return self._call_all(stages.gradients, context_id, what="gradients")

    def drain_events(self) -> list[tuple]:
        """Timing events recorded since the last drain: ``(stage, step, microbatch, phase, start, end)``."""
        return [(i, *event) for i, events in enumerate(self._call_all(stages.drain_events, what="timeline"))
                for event in events]

    def stage_labels(self) -> list[str]:
        return [f"stage {i + 1} {p}" for i, p in enumerate(self.placement)]

    def close(self) -> None:
        """Release the shards on their processes. Idempotent; never raises."""
        if self._ids:
            self._finalizer.detach()
            _release(self._processes_and_ids())
            self._ids = []

    def __enter__(self) -> "PipelineModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def extra_repr(self) -> str:
        return (f"placement={item_list(self.placement)}, microbatch_size={self.microbatch_size}, "
                f"cut={self.cut!r}")


def _release(processes_and_ids) -> None:
    if not rpc.api._is_current_rpc_agent_set():
        return
    by_process: dict[str, list[str]] = {}
    for process, stage_id in processes_and_ids:
        by_process.setdefault(process, []).append(stage_id)
    futures = []
    for process, ids in by_process.items():
        try:
            futures.append(rpc.rpc_async(process, stages.release, args=(ids,), timeout=5))
        except Exception:  # noqa: BLE001 - the process may be gone; nothing left to release
            pass
    for future in futures:
        try:
            future.wait()
        except Exception:  # noqa: BLE001
            pass


class PipelineOptimizer:
    """One local optimizer per shard, stepped with that shard's distributed gradients.

    This is what the upstream example uses now instead of ``DistributedOptimizer`` (which warns
    that its TorchScript path is deprecated): each stage reads ``dist_autograd.get_gradients``
    and steps its own ``optimizer_class(shard.parameters(), **kwargs)``.
    """

    def __init__(self, model: PipelineModel, optimizer_class=torch.optim.SGD, **kwargs):
        self.model = model
        model._call_all(stages.make_optimizer, optimizer_class, kwargs, what="creating the optimizer")

    def step(self, context_id: int) -> None:
        self.model._call_all(stages.optimizer_step, context_id, what="optimizer step")
