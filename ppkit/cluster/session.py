"""The notebook's current cluster: ``ppkit.start`` replaces it, so re-running a cell leaks nothing."""

from __future__ import annotations

from ppkit.cluster.controller import Cluster

_active: Cluster | None = None


def start(world_size: int = 2, backend: str = "auto", **options) -> Cluster:
    """Start ``world_size`` background workers and return the cluster.

    Closes the cluster that the previous ``start`` made, so re-running the cell is safe.
    Options: ``timeout`` (seconds per job, default 60), ``start_timeout``, ``process_group``.

    >>> cluster = ppkit.start(4)
    >>> cluster.run(lambda rank, world_size: rank)
    [0, 1, 2, 3]
    """
    global _active
    from ppkit.cluster import launch, magic
    from ppkit.cluster.controller import _check_timeout

    # Check what can be checked before closing the cluster this call replaces: a typo in the
    # arguments should not cost the learner a working cluster.
    world_size = launch.check_world_size(world_size)
    if backend != "auto":
        launch.resolve_backend(backend, world_size)
    for name in ("timeout", "start_timeout"):
        if name in options:
            _check_timeout(options[name], name)
    if _active is not None:
        _active.close()
        _active = None
    _active = Cluster(world_size, backend, **options)
    magic.register()
    return _active


def active() -> Cluster | None:
    """The cluster that ``start`` made last, if it is still open."""
    return _active if _active is not None and _active.state != "closed" else None
