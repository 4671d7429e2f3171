"""The pipeline model: micro-batches sent through shards on RPC processes, as in the tutorial.

    world = ppkit.start_rpc(2)
    model = PipelineModel("worker1:cpu,worker2:cpu", microbatch_size=4)
    optimizer = PipelineOptimizer(model, torch.optim.SGD, lr=0.05)
    with dist_autograd.context() as context_id:
        loss = loss_fn(model(inputs), labels)
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)

Every shard is built on its own process from a seed (``resnet50(seed)`` split at ``cut``), so the
pipeline computes exactly what a local ``ppkit.models.resnet.resnet50(seed)`` computes. Placing
the shards is ``ppkit.pipeline.rpc.deploy``'s; the optimizer is ``ppkit.pipeline.rpc.optimizer``'s.
"""

from __future__ import annotations

import functools
import itertools
import weakref

import torch
import torch.distributed.rpc as rpc
from torch import nn

from ppkit import compat
from ppkit.checks import positive
from ppkit.errors import ClusterStateError, ConfigError, StageError
from ppkit.models.resnet import DEFAULT_CUT, check_cut
from ppkit.pipeline.rpc import deploy, stages
from ppkit.pipeline.rpc.config import Placement, check_microbatch_size, item_list, parse_placement
from ppkit.pipeline.rpc.failures import first_line, is_timeout
from ppkit.pipeline.rpc.stage import resnet_shard


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
            shards = [functools.partial(resnet_shard, i, cut, seed, num_classes, dtype)
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
        deploy.check_world(self.placement, shards, self._rpc_timeout)
        self._ids = deploy.create_stages(self.placement, shards, self._rpc_timeout)
        self._finalizer = weakref.finalize(self, deploy.release, self._processes_and_ids())
        self._finalizer.atexit = False  # at interpreter exit the RPC world may be gone already

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
        grad = torch.is_grad_enabled() and compat.in_dist_autograd_context()
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
            if is_timeout(exc):
                limit = f"{self.timeout:g} s" if self.timeout else "the RPC world's timeout"
                what = (f"{where} did not answer within {limit} on micro-batch {mb} of {len(calls)}. "
                        "It may still be busy: world.restart() gives fresh processes.")
            else:
                what = (f"{where} failed: {first_line(exc)} (micro-batch {mb} of {len(calls)}). The "
                        "stage's traceback is in this error's __cause__; the model stays usable.")
            raise StageError(what, stage=i, process=p.process, microbatch=mb) from exc
        return outputs

    def call_stages(self, fn, *args, what: str) -> list:
        """``fn(stage_id, *args)`` on every stage's process, one result per stage; ``what`` names
        the call in the ``StageError`` raised for the first stage that fails."""
        self._check_open()
        futures = [rpc.rpc_async(p.process, fn, args=(stage_id, *args), timeout=self._rpc_timeout)
                   for p, stage_id in zip(self.placement, self._ids)]
        results = []
        for i, future in enumerate(futures):
            try:
                results.append(future.wait())
            except Exception as exc:
                p = self.placement[i]
                raise StageError(f"{what} failed on stage {i + 1} ({p}): {first_line(exc)}",
                                 stage=i, process=p.process) from exc
        return results

    def train(self, mode: bool = True) -> "PipelineModel":
        """Set train/eval mode (BatchNorm!) on every shard."""
        super().train(mode)
        if self._ids:
            self.call_stages(stages.set_train, bool(mode), what="setting train mode")
        return self

    def parameter_rrefs(self) -> list[rpc.RRef]:
        """One RRef per parameter of every shard, for ``DistributedOptimizer``."""
        return [rref for per_stage in self.call_stages(stages.parameter_rrefs, what="parameter_rrefs")
                for rref in per_stage]

    def state_dicts(self) -> list[dict]:
        """Each shard's ``state_dict`` (CPU copies), keyed as in ``split_resnet50``'s shards."""
        return self.call_stages(stages.state_dict, what="state_dict")

    def gradients(self, context_id: int) -> list[dict]:
        """Each shard's gradients in distributed-autograd context ``context_id``, by name."""
        return self.call_stages(stages.gradients, context_id, what="gradients")

    def drain_events(self) -> list[tuple]:
        """Timing events recorded since the last drain: ``(stage, step, microbatch, phase, start, end)``."""
        return [(i, *event) for i, events in enumerate(self.call_stages(stages.drain_events, what="timeline"))
                for event in events]

    def stage_labels(self) -> list[str]:
        return [f"stage {i + 1} {p}" for i, p in enumerate(self.placement)]

    def close(self) -> None:
        """Release the shards on their processes. Idempotent; never raises."""
        if self._ids:
            self._finalizer.detach()
            deploy.release(self._processes_and_ids())
            self._ids = []

    def __enter__(self) -> "PipelineModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def extra_repr(self) -> str:
        return (f"placement={item_list(self.placement)}, microbatch_size={self.microbatch_size}, "
                f"cut={self.cut!r}")
