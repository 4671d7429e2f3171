"""What one run asks of its output: which ranks and streams reach the cell, which go to files, the
prefix of each line, whether lines of several ranks are collapsed and ``\\r``-redrawn lines shown in place.

``%%torchrun`` builds one from torchrun's ``--tee``, ``--redirects``, ``--log-dir``,
``--local-ranks-filter`` and ``--log-line-prefix-template`` (torchrun/options.py); ``cluster.run``
and ``%%ranks`` use ``PLAIN``: every line of every rank, ``[rank N] ...``, as printed.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from string import Template

STREAMS = ("stdout", "stderr")


@dataclass(frozen=True)
class OutputSettings:
    """``hidden``: ``(rank, stream)`` pairs kept out of the cell; ``logged``: those written to
    ``log_dir``'s files, in torchrun's layout (logfiles.py); ``prefix``: a torchrun template
    (``${rank}``, ``${local_rank}``, ``${role_name}``, ``${hostname}``), "" for ``[rank N] ``;
    ``hosts``: ``(rank, node)`` pairs, as each rank named its node (``on_hosts``), for ``${hostname}``: a rank
    not among them (or no hosts given) is on the notebook's machine;
    ``collapse``: lines of several ranks that are the same, or differ only in their numbers, shown once
    (collapse.py, fold.py); ``live``: a line
    redrawn with ``\\r`` (tqdm) updated in place (live.py)."""

    hidden: frozenset[tuple[int, str]] = frozenset()
    logged: frozenset[tuple[int, str]] = frozenset()
    log_dir: str | None = None
    run_id: str = "none"
    prefix: str = ""
    role: str = "default"
    nproc_per_node: int = 0  # for ${local_rank}; 0: the rank itself
    collapse: bool = False
    live: bool = False
    hosts: tuple[tuple[int, str], ...] = ()

    def shown(self, rank: int, stream: str) -> bool:
        return (rank, stream) not in self.hidden

    def on_hosts(self, hosts: dict[int, str]) -> OutputSettings:
        """These settings for ranks on ``hosts`` (rank -> the name of its node, as the rank gave it).

        ``${hostname}`` is the rank's node, as torchrun's agent on each node puts its own hostname in
        its ranks' prefixes; not the notebook's machine, where the ranks run elsewhere (SLURM)."""
        return replace(self, hosts=tuple(sorted(hosts.items())))

    def label(self, ranks: list[int], labels: list[str] | None = None) -> str:
        """The prefix of a line that ``ranks`` printed (several: a collapsed line, its nodes joined by commas)."""
        if self.prefix:
            local = [r % self.nproc_per_node for r in ranks] if self.nproc_per_node else ranks
            hosts, here = dict(self.hosts), socket.gethostname()
            return Template(self.prefix).safe_substitute(
                rank=rank_ranges(ranks), local_rank=rank_ranges(sorted(set(local))), role_name=self.role,
                hostname=",".join(dict.fromkeys(hosts.get(r, here) for r in ranks)))
        if len(ranks) == 1:
            return f"[{labels[ranks[0]] if labels else f'rank {ranks[0]}'}] "
        return f"[ranks {rank_ranges(ranks)}] "


PLAIN = OutputSettings()


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 5]`` -> ``"0-3,5"``."""
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ",".join(parts)
