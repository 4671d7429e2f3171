"""Putting a pipeline's shards on their processes, and taking them off again.

Everything is checked before anything is built (the processes exist, have the devices the placement
names and can import the shards' code), so a mistake is one clear error instead of a half-built
pipeline; a build that fails on one process releases what the others built.
"""

from __future__ import annotations

import functools
import uuid

import torch.distributed.rpc as rpc

from ppkit import compat
from ppkit.errors import ClusterStateError, StageError
from ppkit.pipeline.rpc import stages
from ppkit.pipeline.rpc.config import Placement, check_placement
from ppkit.pipeline.rpc.failures import first_line

# What every process holding a stage must be able to import.
REQUIRED_MODULES = ("torch", "torchvision", "ppkit.pipeline.rpc.stages")


def rpc_names() -> list[str]:
    """The names of the RPC world's processes, by rank."""
    if not compat.rpc_agent_running():
        raise ClusterStateError(
            "no RPC world in this process: start one with world = ppkit.start_rpc(num_workers=2) "
            "before building a pipeline model.")
    agent = compat.current_rpc_agent()
    return [info.name for info in sorted(agent.get_worker_infos(), key=lambda info: info.id)]


def _module_of(builder) -> str | None:
    while isinstance(builder, functools.partial):
        builder = builder.func
    name = getattr(builder, "__module__", None)
    return name if name and name != "__main__" else None


def check_world(placement: tuple[Placement, ...], shards, timeout: float) -> None:
    """Check that every process of ``placement`` exists, can import what its ``shards`` need and
    has the devices named; ``ConfigError`` or ``StageError`` if not."""
    names = rpc_names()
    check_placement(placement, names)  # names first: probing needs them to exist
    modules = {}
    for where, builder in zip(placement, shards):
        extra = _module_of(builder)
        modules.setdefault(where.process, set(REQUIRED_MODULES))
        if extra:
            modules[where.process].add(extra)
    futures = {process: rpc.rpc_async(process, stages.probe, args=(sorted(needed),), timeout=timeout)
               for process, needed in modules.items()}
    devices = {}
    for process, future in futures.items():
        stage = next(i for i, p in enumerate(placement) if p.process == process)
        try:
            report = future.wait()
        except Exception as exc:
            raise StageError(
                f"{process} could not run ppkit's stage code: {first_line(exc)}. Check that ppkit, "
                f"torch and torchvision are installed where {process} runs (the same versions "
                "as here: ppkit version).", stage=stage, process=process) from exc
        for module, reason in report["missing"].items():
            raise StageError(
                f"{process} cannot import {module!r}, which shard {stage + 1} needs ({reason}). "
                f"Install it on {process}'s machine, or define the shard in the notebook and "
                "ship it by value with ppkit.by_value(...).", stage=stage, process=process)
        devices[process] = report["cuda"]
    check_placement(placement, names, devices)


def create_stages(placement: tuple[Placement, ...], shards, timeout: float) -> list[str]:
    """Build shard ``i`` on ``placement[i]``, each stage pulling from the one before; the stage ids.

    Waits for every build, then raises ``StageError`` for the first that failed (after releasing
    the others)."""
    prefix = uuid.uuid4().hex[:12]
    ids = [f"{prefix}-{i}" for i in range(len(shards))]
    futures = []
    for i, (where, builder) in enumerate(zip(placement, shards)):
        previous = None if i == 0 else (placement[i - 1].process, ids[i - 1])
        futures.append(rpc.rpc_async(where.process, stages.create,
                                     args=(ids[i], i, builder, where.device, previous), timeout=timeout))
    errors = []
    for i, future in enumerate(futures):
        try:
            future.wait()
        except Exception as exc:  # noqa: BLE001 - reported below, after every build finished
            errors.append((i, exc))
    if errors:
        release([(p.process, stage_id) for p, stage_id in zip(placement, ids)])
        i, exc = errors[0]
        process = placement[i].process
        raise StageError(
            f"could not build shard {i + 1} on {process} ({placement[i].device}): {first_line(exc)}",
            stage=i, process=process) from exc
    return ids


def release(processes_and_ids) -> None:
    """Release stages, given as ``(process, stage id)`` pairs. Never raises: a process that is gone
    has nothing left to release."""
    if not compat.rpc_agent_running():
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
