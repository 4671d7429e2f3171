"""Each rank's output, from the inbox to the cell: ``printer`` (the lines, ``[rank N] ...``),
``settings`` (what one run asks: torchrun's --tee, --redirects, --log-dir, --local-ranks-filter,
--log-line-prefix-template), ``collapse`` (lines of several ranks shown once: the same line, or lines that
differ only in their numbers, folded by ``fold`` into their spread and the rank that stands out), ``live``
(``\\r``-redrawn lines such as tqdm's in place) and ``logfiles`` (each rank's files, and output the
cell could not take in time)."""

from ppkit.cluster.output.printer import RankPrinter
from ppkit.cluster.output.settings import PLAIN, OutputSettings

__all__ = ["PLAIN", "OutputSettings", "RankPrinter"]
