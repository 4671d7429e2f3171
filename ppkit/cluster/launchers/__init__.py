"""Launchers, chosen by name: how a Cluster gets its worker processes.

=========  ==============================================================================
"local"    a fork server on this machine imports torch once and forks each rank (local.py)
"spawn"    each rank a fresh interpreter on this machine, no fork at all (spawn.py)
"remote"   agents started by hand (``ppkit worker``) or by ssh on other machines (remote.py)
"slurm"    the tasks of a SLURM job, submitted with sbatch or started with srun (slurm.py)
=========  ==============================================================================

Each is a small class built from the same three things (a ``ClusterSpec``, the cluster's inbox
and its key) and used by ``Cluster`` only through the members of ``base.Launcher``.
"""

from __future__ import annotations

import importlib

from ppkit.cluster.launchers.base import Launcher, Process, child_env, start_module

REGISTRY = {  # name -> "module:class", imported when used (the slurm tools stay unloaded otherwise)
    "local": "ppkit.cluster.launchers.local:ForkServerLauncher",
    "spawn": "ppkit.cluster.launchers.spawn:SpawnLauncher",
    "remote": "ppkit.cluster.launchers.remote:RemoteLauncher",
    "slurm": "ppkit.cluster.launchers.slurm:SlurmLauncher",
}


def launcher_class(name: str) -> type[Launcher]:
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def create(spec, inbox, key: bytes) -> Launcher:
    """The launcher ``spec.launcher`` names, for a cluster with this inbox and key."""
    return launcher_class(spec.launcher)(spec, inbox, key)


__all__ = ["REGISTRY", "Launcher", "Process", "child_env", "create", "launcher_class", "start_module"]
