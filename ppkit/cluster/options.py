"""Every option of ``ppkit.start`` / ``Cluster`` and ``ppkit.start_rpc`` / ``RpcWorld``, checked
before anything runs or stops.

A second ``ppkit.start(...)`` replaces the learner's working cluster: if its arguments are checked
only once the old cluster is closed, a typo costs the work of the cells before it. So both the
replacing calls and the constructors call these first; they read no running state and start
nothing (generic checks live in ppkit/checks.py, network addresses in admission.py).
"""

from __future__ import annotations

from ppkit.checks import check_env, check_labels, positive
from ppkit.cluster import launch, spawning
from ppkit.cluster.admission import master_interface, parse_key, parse_listen, remote_names, rpc_remote_names
from ppkit.errors import ConfigError


def check_network(world_size: int, listen, remote, key, backend: str = "gloo") -> None:
    """``listen``/``remote``/``key`` together: the last two mean nothing without the first."""
    if listen is None:
        given = [n for n, v in (("remote", remote), ("key", key)) if v is not None]
        if given:
            raise ConfigError(
                f"{'= and '.join(given)}= only {'apply' if len(given) > 1 else 'applies'} to workers on "
                f"other machines, which need "
                f"listen='ADDR:PORT' too (e.g. listen='10.0.0.1:29600', remote=['worker1']). Without "
                f"listen every rank runs on this machine: drop {' and '.join(n + '=' for n in given)}.")
        return
    host, _ = parse_listen(listen)
    master_interface(host)
    parse_key(key)
    if backend not in ("auto", "gloo"):
        raise ConfigError(
            f"remote workers use the gloo backend (CPU tensors between machines), not {backend!r}. "
            "Pass backend='gloo' or 'auto' with listen=....")


def check_cluster(world_size, backend: str = "auto", **options) -> int:
    """Refuse anything ``Cluster(world_size, backend, **options)`` would refuse; the checked size.
    (``ppkit.start`` checks the keywords themselves with ``checks.check_keywords`` first.)"""
    world_size = launch.check_world_size(world_size)
    if backend != "auto" and options.get("listen") is None:
        launch.resolve_backend(backend, world_size)  # nccl: counts the GPUs
    for name in ("timeout", "start_timeout"):
        if name in options:
            positive(options[name], name)
    if not isinstance(options.get("process_group", True), bool):
        raise ConfigError(f"process_group must be True (the ranks join a torch.distributed process "
                          f"group) or False (they do not), got {options['process_group']!r}.")
    check_env(options.get("env"))
    check_labels(options.get("labels"), world_size)
    check_network(world_size, options.get("listen"), options.get("remote"), options.get("key"), backend)
    spawning.check_start(options.get("start_method", "auto"), options.get("listen"))
    if options.get("listen") is not None:
        remote_names(world_size, options.get("remote"))
    return world_size


def check_rpc(num_workers, **options) -> None:
    """Refuse anything ``RpcWorld(num_workers, **options)`` would refuse but the kernel's own RPC
    state (rpc_world.py checks that)."""
    launch.check_world_size(num_workers)
    threads = options.get("num_worker_threads", 16)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"num_worker_threads must be a positive whole number (e.g. 16), got {threads!r}.")
    for name in ("rpc_timeout", "start_timeout"):
        if name in options:
            positive(options[name], name)
    check_env(options.get("env"))
    listen, remote, key = options.get("listen"), options.get("remote"), options.get("key")
    check_network(num_workers, listen, remote, key)
    spawning.check_start(options.get("start_method", "auto"), listen)
    if listen is not None:
        rpc_remote_names([f"worker{i}" for i in range(1, num_workers + 1)], remote)
