"""ppkit: a JupyterLab teaching kit for PyTorch distributed training.

    import ppkit
    cluster = ppkit.start(4)            # four background ranks (gloo on CPU)
    cluster.run(fn)                     # fn(rank, world_size) on every rank, results by rank
    cluster.close()
    ppkit.spawn(fn, args=(2,), nprocs=2)  # mp.spawn's fn(i, *args), fresh processes every call
"""

from ppkit.cluster.controller import Cluster
from ppkit.cluster.rpc.world import RpcWorld, by_value, start_rpc
from ppkit.cluster.session import start
from ppkit.cluster.spawn.call import SpawnContext, spawn
from ppkit.cluster.tools.env import read_launch_env
from ppkit.errors import (
    AuthenticationError,
    ClusterStateError,
    ConfigError,
    JobInterrupted,
    JobTimeoutError,
    LaunchError,
    PPKitError,
    ProcessExitedError,
    ProcessRaisedError,
    RemoteError,
    RpcPickleError,
    StageError,
    StageTimeoutError,
    WorkerDiedError,
    WorkerError,
)
from ppkit.transport.worker import ppkit_version

__version__ = ppkit_version()  # pyproject.toml is the one place it is written


def load_ipython_extension(ipython):
    """``%load_ext ppkit`` registers the ``%%ranks`` cell magic."""
    from ppkit.cluster import session

    session.register(ipython)


__all__ = [
    "AuthenticationError",
    "Cluster",
    "ClusterStateError",
    "ConfigError",
    "JobInterrupted",
    "JobTimeoutError",
    "LaunchError",
    "PPKitError",
    "ProcessExitedError",
    "ProcessRaisedError",
    "RemoteError",
    "RpcPickleError",
    "RpcWorld",
    "SpawnContext",
    "StageError",
    "StageTimeoutError",
    "WorkerDiedError",
    "WorkerError",
    "__version__",
    "by_value",
    "read_launch_env",
    "spawn",
    "start",
    "start_rpc",
]
