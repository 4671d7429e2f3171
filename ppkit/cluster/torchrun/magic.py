"""``%%torchrun`` and ``%torchrun``: torchrun's command line in a notebook, registered by ``%load_ext ppkit``.

    %%torchrun --nproc-per-node 2 -- --epochs 3
    import argparse, torch.distributed as dist
    ...                                  # a torchrun script, run as __main__ on every rank

    %torchrun --nproc-per-node 2 train.py --epochs 3
"""

from __future__ import annotations

import itertools
import shlex

from ppkit.cluster.torchrun import launch, options
from ppkit.errors import ConfigError

_cell_ids = itertools.count(1)


def torchrun(line: str, cell: str | None = None):
    """``%%torchrun [torchrun options] [-- script args]`` runs the cell as the script on every rank;
    ``%torchrun [torchrun options] script.py [script args]`` runs a file (``-m pkg.train``: a module).
    ppkit adds ``--timeout S``, ``--no-collapse`` (every line of every rank as printed) and ``--profile``
    (every rank under torch.profiler: the cell's value is a ``ppkit.Profile``, ``_`` in the next cell)."""
    from IPython.core.error import UsageError

    __tracebackhide__ = True  # noqa: F841 - IPython then shows the message, not the frames that passed it on
    try:
        parsed = options.parse(shlex.split(line), cell=cell is not None)
        if parsed is None:  # -h printed torchrun's help
            return
    except (ConfigError, ValueError) as exc:  # ValueError: shlex's unbalanced quotes
        raise UsageError(f"{'%%' if cell is not None else '%'}torchrun: {exc}") from None
    for note in parsed.notes:  # options accepted that change nothing here, said once
        print(note, flush=True)
    if cell is not None:
        return launch.run_cell(parsed, cell, str(next(_cell_ids)))
    return launch.run_file(parsed)


def register(ipython) -> None:
    ipython.register_magic_function(torchrun, magic_kind="line_cell", magic_name="torchrun")
