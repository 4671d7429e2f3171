"""What ppkit needs from torch beyond its public API, checked where it is used, with an error that names it.

The RPC world aligns two pieces of torch's private RPC state across processes (the count of
``init_rpc`` calls that prefixes the rendezvous keys, and the rounds of RPC's internal all_gather);
without them a second world in one kernel waits forever. torch may rename them in any release, so
:func:`require_rpc_internals` looks them up first and says which one is missing instead of hanging.
``torch.distributed.pipelining`` (notebook 08, ``ppkit pipeline --schedule gpipe``) appeared in torch 2.4.

The versions ppkit is tested with are in docs/versions.md (scripts/version_matrix.py makes that table).
"""

from __future__ import annotations

import sys

from ppkit.errors import ClusterStateError

RPC_LESSONS = ("notebooks 04 (RPC and RRefs), 05 (model parallel) and 06 (the RPC pipeline), and "
               "`ppkit pipeline --schedule rpc`")

# (module path, attribute) pairs the RPC world reads or writes.
RPC_INTERNALS = (
    ("torch.distributed.rpc", "_init_counter"),
    ("torch.distributed.rpc", "_init_counter_lock"),
    ("torch.distributed.rpc.api", "_all_gather_sequence_id"),
    ("torch.distributed.rpc.api", "_all_gather_sequence_id_to_states"),
    ("torch.distributed.rpc.api", "_is_current_rpc_agent_set"),
    ("torch.distributed.rpc.api", "_get_current_rpc_agent"),
)
TESTED_RANGE = "torch 2.12.1 and 2.14.1 on Python 3.10 to 3.13 (docs/versions.md)"


def _torch_version() -> str:
    import torch

    return torch.__version__


def missing_rpc_internals() -> list[str]:
    """The private names of :data:`RPC_INTERNALS` this torch does not have (empty when all are there)."""
    import importlib

    missing = []
    for module_name, attr in RPC_INTERNALS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.append(module_name)
            continue
        if not hasattr(module, attr):
            missing.append(f"{module_name}.{attr}")
    return missing


def require_rpc_platform(platform: str | None = None) -> None:
    """ClusterStateError naming the RPC lessons where torch has no RPC (Windows, some builds)."""
    import torch.distributed.rpc as rpc

    platform = platform or sys.platform
    if platform == "win32" or not rpc.is_available():
        why = ("torch.distributed.rpc (TensorPipe) is not built for Windows" if platform == "win32"
               else f"this torch {_torch_version()} was built without torch.distributed.rpc")
        raise ClusterStateError(
            f"{RPC_LESSONS} need PyTorch RPC, and {why}, so they cannot run on this machine. The other "
            "lessons work here; for these, use Linux or macOS (WSL2 on Windows) or a hosted Linux notebook.")


def require_rpc_internals() -> None:
    """ClusterStateError naming what is missing if this torch lacks RPC or the RPC internals ppkit aligns."""
    require_rpc_platform()
    missing = missing_rpc_internals()
    if missing:
        raise ClusterStateError(
            f"ppkit's RPC world cannot start on torch {_torch_version()}: it keeps the RPC state of every "
            f"process in step through torch internals, and this torch has no {', '.join(missing)}. Without "
            f"them a second RPC world would wait forever. ppkit is tested with {TESTED_RANGE}: install one "
            "of those (pip install 'torch==2.14.1' 'torchvision==0.29.1'), or report the torch version.")


def require_pipelining(what: str = "this lesson") -> None:
    """ClusterStateError if ``torch.distributed.pipelining`` is absent (torch before 2.4)."""
    try:
        import torch.distributed.pipelining  # noqa: F401
    except ImportError as e:
        raise ClusterStateError(
            f"{what} needs torch.distributed.pipelining, which torch {_torch_version()} does not have "
            f"({e}); it appeared in torch 2.4. Install a newer torch (ppkit is tested with {TESTED_RANGE}), "
            "or use the RPC pipeline (ppkit pipeline --schedule rpc, notebook 06).") from None


# -- torch's private RPC state: read and written only here (RPC_INTERNALS lists it) --------------------
def rpc_agent_running() -> bool:
    """True while this process has an RPC agent (``init_rpc`` ran and ``shutdown`` did not yet)."""
    from torch.distributed.rpc import api

    return api._is_current_rpc_agent_set()


def current_rpc_agent():
    """This process's RPC agent (call only while :func:`rpc_agent_running`)."""
    from torch.distributed.rpc import api

    return api._get_current_rpc_agent()


def rpc_init_count() -> int:
    """How many times this process called ``init_rpc`` (torch prefixes the rendezvous keys with it)."""
    from torch.distributed import rpc

    return rpc._init_counter


def align_rpc_state(init_count: int | None) -> None:
    """Start this process's RPC from the state every process of a new world shares.

    torch prefixes the rendezvous keys with a per-process count of ``init_rpc`` calls
    ("rpc_prefix_N"): a kernel that re-initialises RPC is at N > 0 while fresh workers are at 0, and
    gloo then waits forever for keys nobody writes, so ``init_count`` (the kernel's) is set
    everywhere. RPC's internal all_gather likewise numbers its rounds per process and keeps the
    states of rounds a dead world never finished: every world starts from a clean slate.
    """
    from torch.distributed import rpc

    if init_count is not None:
        with rpc._init_counter_lock:
            rpc._init_counter = init_count
    rpc.api._all_gather_sequence_id.clear()
    rpc.api._all_gather_sequence_id_to_states.clear()


def in_dist_autograd_context() -> bool:
    """True inside a ``torch.distributed.autograd.context()`` block of this thread."""
    import torch.distributed.autograd

    try:
        torch.distributed.autograd._current_context()
    except RuntimeError:
        return False
    return True


def set_fsdp_unshard_async(model, async_op: bool) -> None:
    """FSDP2's all-gathers as ``async_op=True`` work (private: ``FSDPModule._set_unshard_async_op``).

    On GPUs FSDP2 overlaps an all-gather with compute through CUDA streams and needs nothing of this. On CPU
    there are no streams: by default each all-gather blocks the thread that issued it, and a prefetch only
    runs beside compute when its all-gather is asynchronous work, waited for when the layer starts."""
    setter = getattr(model, "_set_unshard_async_op", None)
    if setter is None:
        from ppkit.errors import ConfigError

        raise ConfigError(f"this torch ({_torch_version()}) has no FSDPModule._set_unshard_async_op, which the "
                          "overlap lesson uses to make FSDP2's all-gathers asynchronous on CPU; wrap the model "
                          "with fully_shard first, or run the lesson with the torch named in pyproject.toml.")
    setter(async_op)


# -- torch.compile's and FP8's private corners (lesson 08c) --------------------------------------------
def inductor_cpp_compiler() -> str:
    """The C++ compiler Inductor builds CPU kernels with; ``RuntimeError`` (torch's ``InvalidCxxCompiler``) if none
    works (private: ``torch._inductor.cpp_builder.get_cpp_compiler``)."""
    from torch._inductor import cpp_builder

    return cpp_builder.get_cpp_compiler()


def inductor_generated_files() -> list[str]:
    """The files of every Python module Inductor generated or loaded from its cache in this process, oldest
    first (private: ``torch._inductor.codecache.PyCodeCache.modules``)."""
    from torch._inductor.codecache import PyCodeCache

    return [m.__file__ for m in PyCodeCache.modules]


def scaled_mm(a, b, scale_a, scale_b, out_dtype):
    """torch's FP8 matmul, ``torch._scaled_mm`` (private; cuBLASLt on H100-class GPUs)."""
    import torch

    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
