"""The torch threads lesson 08c measures with: one, for the peak and for every step alike.

On a machine whose cores other work shares, torch's OpenMP threads wait for each other at every operator: under
load on 2 cores a 15 ms step of lesson 08b's GPT took 4 s with two threads. MFU divides by a peak, so the peak and
the steps must run with the same threads; one thread keeps both steady.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from ppkit.errors import ConfigError

THREADS = 1


@contextmanager
def threads(n: int = THREADS):
    """torch runs with ``n`` threads inside the block, and with as many as before after it."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"threads must be a whole number of at least 1; got {n!r}.")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)
