"""ppkit: a JupyterLab teaching kit for PyTorch distributed training.

    import ppkit
    cluster = ppkit.start(4)            # four background ranks (gloo on CPU)
    cluster.run(fn)                     # fn(rank, world_size) on every rank, results by rank
    cluster.close()
    ppkit.spawn(fn, args=(2,), nprocs=2)  # mp.spawn's fn(i, *args), fresh processes every call
    ppkit.torchrun(main, nproc_per_node=2)  # a torchrun script's main(): RANK, WORLD_SIZE... in os.environ
    prof = ppkit.spawn(fn, args=(2,), nprocs=2, profile=True)  # a ppkit.Profile: every rank's timeline
    ppkit.collective_doctor(cluster)    # where the ranks' collectives disagree (also shown when a run hangs)
    ppkit.log_metrics(step=i, loss=l)   # on a rank: a live plot under the cell; ppkit.metrics() afterwards
    ppkit.fail_rank(1, how="raise", at_step=3)  # the next run's rank 1 fails at ppkit.step(3) in its loop
                                        # (how="kill", signal=..., or "hang"; a kill during a run: at once)
    ppkit.compare_runs(reference, cluster.run(train))  # a ParityReport: the first step, tensor and rank that
                                        # differ from one process (each rank records with ppkit.ParityRecorder)

    %load_ext ppkit                     # then a cell that starts with %%torchrun --nproc-per-node 2
                                        # runs as a torchrun script (__main__, argparse after --)
"""

from ppkit.cluster.controller import Cluster
from ppkit.cluster.faults.arming import fail_rank
from ppkit.cluster.faults.on_rank import step
from ppkit.cluster.hang_doctor.on_demand import collective_doctor
from ppkit.cluster.output.metrics_board import metrics
from ppkit.cluster.rpc.world import RpcWorld, by_value, start_rpc
from ppkit.cluster.session import start
from ppkit.cluster.spawn.call import SpawnContext, spawn
from ppkit.cluster.tools.env import read_launch_env
from ppkit.cluster.torchrun.launch import torchrun
from ppkit.errors import (
    AuthenticationError,
    ClusterStateError,
    ConfigError,
    DebuggerQuit,
    JobInterrupted,
    JobTimeoutError,
    LaunchError,
    ParityError,
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
from ppkit.profiling.profile import Profile
from ppkit.transport.metrics import log_metrics
from ppkit.transport.worker import ppkit_version

__version__ = ppkit_version()  # pyproject.toml is the one place it is written

# ppkit.parity imports torch: loaded on first use, so that ``import ppkit`` leaves the kernel without torch (the fork
# server imports it for the workers; tests/test_cluster_lifecycle.py)
_PARITY = ("ParityRecorder", "ParityReport", "ParityRun", "compare_runs")


def __getattr__(name: str):
    if name in _PARITY:
        from ppkit import parity

        return getattr(parity, name)
    raise AttributeError(f"module 'ppkit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PARITY))


def load_ipython_extension(ipython):
    """``%load_ext ppkit`` registers the ``%%ranks`` cell magic and ``%%torchrun`` / ``%torchrun``, and
    starts in the background the fork server their first 2-process run uses (PPKIT_PRESTART=0: not)."""
    from ppkit.cluster import session
    from ppkit.cluster.spawn import call as spawn_call
    from ppkit.cluster.torchrun import magic

    session.register(ipython)
    magic.register(ipython)
    spawn_call.prestart()


def _prestart_in_a_kernel() -> None:
    """In a Jupyter kernel (never in a plain script), ``import ppkit`` starts the fork server of a first
    2-process ``ppkit.spawn`` / ``%%torchrun`` in the background, as ``%load_ext ppkit`` does
    (PPKIT_PRESTART=0: not): that call then costs a few forks, not an ``import torch``. It also records the
    ppkit errors raised in the kernel's cells in the learner's progress record (ppkit/progress/)."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if getattr(shell, "kernel", None) is not None:
        from ppkit.cluster.spawn import call as spawn_call
        from ppkit.progress import hooks as progress

        spawn_call.prestart()
        progress.register(shell)  # ppkit errors raised in cells go to the learner's progress record


_prestart_in_a_kernel()

__all__ = [
    "AuthenticationError",
    "Cluster",
    "ClusterStateError",
    "ConfigError",
    "DebuggerQuit",
    "JobInterrupted",
    "JobTimeoutError",
    "LaunchError",
    "PPKitError",
    "ParityError",
    "ParityRecorder",
    "ParityReport",
    "ParityRun",
    "Profile",
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
    "collective_doctor",
    "compare_runs",
    "fail_rank",
    "log_metrics",
    "metrics",
    "read_launch_env",
    "spawn",
    "start",
    "start_rpc",
    "step",
    "torchrun",
]
