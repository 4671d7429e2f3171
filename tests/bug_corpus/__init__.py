"""A corpus of small distributed programs with their truth as data, and the grader that runs each one through
ppkit's entry points and grades what the collective doctor and the parity tool answer (right, unsure, silent,
false) by the facts of their structured results.

    python -m tests.bug_corpus.grade              # every program, a table on stdout
    python -m tests.bug_corpus.grade --table      # ... and written into docs/debugging.md
    python -m tests.bug_corpus.grade --quick      # the suite's fixed part (tests/test_bug_corpus.py)

One module per area (collectives, p2p, groups, ddp, parallel, parity_cases); truth.py says what a truth is.
"""

from __future__ import annotations

import sys

import cloudpickle

from tests.bug_corpus import collectives, ddp, groups, p2p, parallel, parity_cases, run  # noqa: F401 (they register)
from tests.bug_corpus.truth import PROGRAMS

# the ranks get the programs (and run.py's rank-side wrappers) by value: they need not import this package, which
# a fresh clone's ranks could not (pytest puts the repository on the test process's sys.path only)
for _module in (collectives, ddp, groups, p2p, parallel, parity_cases, run, sys.modules["tests.bug_corpus.common"]):
    cloudpickle.register_pickle_by_value(_module)

__all__ = ["PROGRAMS"]
