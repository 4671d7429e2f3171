"""Parity: does a parallel run compute what one process computes?

    rec = ppkit.ParityRecorder()                  # on every rank: record(step, model, loss) after backward
    runs = cluster.run(train, steps)              # each rank returns rec.run
    report = ppkit.compare_runs(reference, runs)  # the reference: the same recorder in one process
    report.raise_if_different()                   # ppkit.ParityError naming the first step, tensor and rank

record.py is the ranks' side (DTensors, hand-cut shards, pipeline stages that hold some names) and precision.py
the precision each tensor was computed in; compare.py the kernel's, pieces.py where each piece lies, tolerance.py
the default tolerance and how it is derived, diagnose.py the words (from case.py's Case: fit.py, patterns.py,
optimizer_steps.py, rounding.py), report.py the result (docs/parity.md).
"""

from ppkit.parity.compare import compare_runs
from ppkit.parity.record import ParityRecorder, ParityRun, Piece
from ppkit.parity.report import Difference, ParityReport
from ppkit.parity.tolerance import Tolerance, default_tolerance

__all__ = ["Difference", "ParityRecorder", "ParityReport", "ParityRun", "Piece", "Tolerance", "compare_runs",
           "default_tolerance"]
