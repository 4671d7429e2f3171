"""torchrun's output options, read into one run's ``OutputSettings`` (cluster/output/):
``--tee``, ``--redirects``, ``--log-dir``, ``--local-ranks-filter``, ``--log-line-prefix-template``,
and ppkit's own ``--no-collapse``.

As under torchrun: ``--redirects`` keeps a stream out of the cell and in the rank's file, ``--tee``
shows it and keeps it, both in ``--log-dir`` (a new temporary folder without one), and
``--local-ranks-filter`` leaves the other local ranks out of the cell, not out of the files.
One difference: ``--log-dir`` alone keeps both streams of every rank (``--tee 3``), where torchrun
would write only its error files there.
"""

from __future__ import annotations

import os

from ppkit.cluster.output import OutputSettings
from ppkit.cluster.output.settings import STREAMS
from ppkit.errors import ConfigError

BITS = {"stdout": 1, "stderr": 2}  # torchrun's Std: 1 stdout, 2 stderr, 3 both


def add_arguments(parser) -> None:
    parser.add_argument("--no-collapse", action="store_true",
                        help="ppkit's own: every line of every rank as printed; by default lines of several "
                             "ranks that are the same, or differ only in their numbers, are shown once, as "
                             "[ranks 0-3] step 10 loss 2.31…2.35 (rank 2: 2.91)")


def settings(args, nproc: int, nnodes: int, run_id: str) -> OutputSettings:
    """``args``: torchrun's parsed options, for ``nproc`` ranks on each of ``nnodes`` nodes."""
    tee = per_rank(args.tee, "--tee", nproc)
    redirects = per_rank(args.redirects, "--redirects", nproc)
    if args.log_dir and not any(tee) and not any(redirects):
        tee = [3] * nproc
    shown = local_ranks(args.local_ranks_filter, nproc)
    hidden, logged = set(), set()
    for rank in range(nproc * nnodes):
        local = rank % nproc
        for stream in STREAMS:
            bit = BITS[stream]
            if (tee[local] | redirects[local]) & bit:
                logged.add((rank, stream))
            if (redirects[local] & bit and not tee[local] & bit) or local not in shown:
                hidden.add((rank, stream))
    prefix = args.log_line_prefix_template or os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "")
    return OutputSettings(frozenset(hidden), frozenset(logged), args.log_dir or None, run_id, prefix, args.role,
                          nproc, collapse=not args.no_collapse, live=True)


def per_rank(value: str, flag: str, nproc: int) -> list[int]:
    """torchrun's ``3`` (every local rank) or ``0:1,1:2`` (local rank: streams) as each local rank's bits."""
    from torch.distributed.elastic.multiprocessing.api import Std, to_map

    try:
        read = Std.from_str(value)
    except ValueError:
        raise ConfigError(f"{flag} {value}: give 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every rank, or "
                          f"LOCAL_RANK:STREAMS pairs, e.g. {flag} 3 or {flag} 0:3,1:2.") from None
    if isinstance(read, dict) and any(rank >= nproc for rank in read):
        raise ConfigError(f"{flag} {value}: names local rank {max(read)}, and this run has {nproc} per node "
                          f"(0 to {nproc - 1}).")
    return [int(to_map(read, nproc)[local]) for local in range(nproc)]


def local_ranks(value: str, nproc: int) -> set[int]:
    """``--local-ranks-filter 0,1``: the local ranks shown in the cell (all without it)."""
    if not value:
        return set(range(nproc))
    try:
        ranks = {int(part) for part in value.split(",")}
    except ValueError:
        ranks = set()
    if not ranks or not all(0 <= rank < nproc for rank in ranks):
        raise ConfigError(f"--local-ranks-filter {value}: give local ranks of this run, 0 to {nproc - 1}, separated "
                          "by commas, e.g. --local-ranks-filter 0 shows rank 0's output only (the files keep all).")
    return ranks
