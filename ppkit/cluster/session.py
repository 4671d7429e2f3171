"""The notebook's session: its current cluster and the ``%%ranks`` cell magic.

``ppkit.start`` replaces the current cluster, so re-running a cell leaks nothing. ``%%ranks``
runs a whole cell on every rank of that cluster:

    %%ranks
    t = torch.ones(1) * rank
    dist.all_reduce(t)
    print(t)

``rank``, ``world_size``, ``torch`` and ``dist`` are defined; names a cell defines stay on the
workers for the next ``%%ranks`` cell. ``%%ranks --timeout 10`` sets the job timeout. ``%%ranks --profile``
runs the cell under torch.profiler on every rank: the cell's value is a ``ppkit.Profile``.
"""

from __future__ import annotations

import itertools
import shlex

from ppkit.checks import check_keywords
from ppkit.cluster.controller import Cluster
from ppkit.cluster.debug import post_mortem
from ppkit.cluster.spec import cluster_spec
from ppkit.errors import ClusterStateError, ConfigError

_active: Cluster | None = None
_cell_ids = itertools.count(1)


def start(world_size: int = 2, backend: str = "auto", **options) -> Cluster:
    """Start ``world_size`` background workers and return the cluster.

    Closes the cluster that the previous ``start`` made, so re-running the cell is safe.
    Options: ``timeout`` (seconds per job, default 60), ``start_timeout``, ``process_group``,
    ``launcher`` ("local", "spawn", "remote" with ``listen=``, or "slurm" with ``nodes``,
    ``partition``, ``time``, ``sbatch_args``; ``start_method`` is the older spelling of the first two).

    >>> cluster = ppkit.start(4)
    >>> cluster.run(lambda rank, world_size: rank)
    [0, 1, 2, 3]
    """
    global _active
    # Check what can be checked before closing the cluster this call replaces: a typo in the
    # arguments should not cost the learner a working cluster.
    check_keywords(Cluster, "ppkit.start()", (world_size, backend), options)
    spec = cluster_spec(world_size, backend, **options)
    if _active is not None:
        _active.close()
        _active = None
    _active = Cluster.from_spec(spec)
    register()
    return _active


def active() -> Cluster | None:
    """The cluster that ``start`` made last, if it is still open."""
    return _active if _active is not None and _active.state != "closed" else None


# -- %%ranks ---------------------------------------------------------------------------------------
def parse_line(line: str) -> dict:
    args = shlex.split(line)
    options: dict = {}
    while args:
        flag = args.pop(0)
        if flag in ("--profile", "--profile-shapes"):
            options["profile"] = {"record_shapes": True} if flag == "--profile-shapes" else True
        elif flag == "--timeout" and args:
            try:
                options["timeout"] = float(args.pop(0))
            except ValueError:
                raise ConfigError(f"%%ranks --timeout needs seconds, e.g. --timeout 10; got {line!r}")
        else:
            raise ConfigError(f"%%ranks does not understand {flag!r}. Usage: %%ranks [--timeout S] [--profile]")
    return options


def ranks(line: str, cell: str):
    from ppkit.transport.worker import exec_cell

    cluster = active()
    if cluster is None:
        raise ClusterStateError("%%ranks needs a running cluster: run cluster = ppkit.start(4) first.")
    options = parse_line(line)
    profile = options.pop("profile", None)
    if profile is None:
        cluster.run_watched(exec_cell, cell, str(next(_cell_ids)), **options)
        return None
    with cluster.profile(profile) as prof:
        cluster.run_watched(exec_cell, cell, str(next(_cell_ids)), **options)
    return prof


def register(ipython=None) -> bool:
    """Register ``%%ranks`` in the running IPython, if there is one."""
    if ipython is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        ipython = get_ipython()
    if ipython is None:
        return False
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
    post_mortem.register(ipython, active)  # %debug after a rank's error: pdb on that rank
    return True
