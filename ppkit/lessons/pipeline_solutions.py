"""Solutions to the pipeline notebooks' exercises, kept out of the notebooks so that a learner
writes their own first; tests run each one through its checker."""

from __future__ import annotations

from ppkit.pipeline.bubble import predict


def best_num_microbatches(forward, backward, fixed_seconds, overhead_seconds, candidates):
    """Notebook 06: the count with the shortest modelled step (bubble bound + overhead)."""

    def step(m):
        ideal = predict([f / m for f in forward], [b / m for b in backward], m).total
        return fixed_seconds + ideal + overhead_seconds * (m - 1)

    return min(sorted(candidates), key=step)
