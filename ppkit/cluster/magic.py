"""The ``%%ranks`` cell magic: run a whole cell on every rank.

    %%ranks
    t = torch.ones(1) * rank
    dist.all_reduce(t)
    print(t)

``rank``, ``world_size``, ``torch`` and ``dist`` are defined; names a cell defines stay on the
workers for the next ``%%ranks`` cell. ``%%ranks --timeout 10`` sets the job timeout.
"""

from __future__ import annotations

import itertools
import shlex

from ppkit.errors import ClusterStateError, ConfigError

_cell_ids = itertools.count(1)


def parse_line(line: str) -> dict:
    args = shlex.split(line)
    options: dict = {}
    while args:
        flag = args.pop(0)
        if flag == "--timeout" and args:
            try:
                options["timeout"] = float(args.pop(0))
            except ValueError:
                raise ConfigError(f"%%ranks --timeout needs seconds, e.g. --timeout 10; got {line!r}")
        else:
            raise ConfigError(f"%%ranks does not understand {flag!r}. Usage: %%ranks [--timeout S]")
    return options


def ranks(line: str, cell: str):
    from ppkit.cluster import session
    from ppkit.transport.worker import exec_cell

    cluster = session.active()
    if cluster is None:
        raise ClusterStateError("%%ranks needs a running cluster: run cluster = ppkit.start(4) first.")
    cluster.run(exec_cell, cell, str(next(_cell_ids)), **parse_line(line))


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
    return True
