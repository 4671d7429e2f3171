"""How `make test` shares the suite between pytest-xdist's workers (``-n 2``), and what must stay together.

The suite spends more than half its time waiting (for processes to start, for timeouts, for a browser or a
hub), so on this project's 2-core machines two workers finish it in much less time than one. A worker is a
pytest session of its own, with its own session fixtures, so each *scope* below runs whole on one worker:

- a test file (its module fixtures: shared clusters, a kernel that keeps state between tests);
- a notebook (nbval's cells are one kernel's run, in order);
- ``browser and hub``: every test under tests/browser/ and the hub testbed's tests: one JupyterLab, one
  chromium, one hub at a time;
- ``slurm``: every test that uses the SLURM testbed and every notebook that does (conftest.py starts the
  testbed for those): one testbed per run, not one per worker.

These two groups are handed out first; the rest go longest first, by each file's seconds in the last run that
timed it (tests/timing.py keeps them in pytest's cache), so that a long file does not start last while the other
worker has nothing left (xdist's own order, most tests first, put a one-test file of two minutes near the end). A
scope the cache does not know counts as the median of those it knows; without a cache (a fresh clone) the order is
xdist's. `check_scopes` (called at collection, on every worker) refuses a run in which a test that
starts one of these components would land outside its group.
"""

from __future__ import annotations

import re
import statistics
from collections import OrderedDict, defaultdict
from functools import cache
from pathlib import Path, PurePosixPath

import slurm_session
from timing import CACHE_KEY

BROWSER = "browser and hub"
SLURM = "slurm"
FIRST = (BROWSER, SLURM)  # longest first: the workers then finish close together
_USES_SLURM = re.compile(r"def \w+\([^)]*\bslurm(_clean|_restore_nodes)?\b|mark\.slurm")


def scope_of(nodeid: str, root: Path) -> str:
    """The scope a test runs in: one of the groups above, or its own file (a notebook counts as a file)."""
    return _scope_of_file(nodeid.split("::", 1)[0], root)


@cache
def _scope_of_file(name: str, root: Path) -> str:  # once per file: a notebook has hundreds of cells
    path = PurePosixPath(name)
    if "browser" in path.parts or path.name.startswith("test_hub"):
        return BROWSER
    if path.suffix == ".ipynb":
        return SLURM if slurm_session.notebook_uses_slurm(root / path) else name
    return SLURM if _USES_SLURM.search(_read(root / path)) else name


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def check_scopes(items, root: Path, kind_of) -> None:
    """Raise if a test that starts the hub, the browser or the SLURM testbed (tests/timing.py's kinds) would
    run outside that component's group, where a second worker would start a second one."""
    wanted = {"hub": BROWSER, "browser": BROWSER, "SLURM": SLURM}
    kinds = {item.nodeid: kind_of(item) for item in items}
    wrong = [f"{nodeid} ({kind} test, scope {scope_of(nodeid, root)!r})" for nodeid, kind in kinds.items()
             if kind in wanted and scope_of(nodeid, root) != wanted[kind]]
    if wrong:
        raise RuntimeError(
            f"{len(wrong)} test(s) would run outside their component's xdist group: {wrong[:5]}. "
            "tests/scheduling.py's scope_of decides the groups: make it place these tests in the group, "
            "e.g. by using the component's fixture by name in the test file.")


def longest_first(scopes: list[str], file_seconds: dict[str, float], root: Path) -> list[str]:
    """``scopes`` in the order they are handed out: the groups of FIRST, then the longest first by
    ``file_seconds`` (a scope's seconds are its files'); unknown scopes count as the median, ties keep their order."""
    seconds: dict[str, float] = defaultdict(float)
    for name, spent in file_seconds.items():
        seconds[scope_of(name, root)] += spent
    known = [seconds[s] for s in scopes if s in seconds]
    typical = statistics.median(known) if known else 0.0
    return sorted(scopes, key=lambda s: (FIRST.index(s) if s in FIRST else len(FIRST), -seconds.get(s, typical)))


def make_scheduler(config, log, file_seconds: dict[str, float] | None = None):
    """pytest-xdist's load-scope scheduler with the scopes above, handed out in ``longest_first``'s order
    (``file_seconds``: the last run's, from pytest's cache, unless given)."""
    from xdist.scheduler import LoadScopeScheduling

    root = Path(str(config.rootpath))
    if file_seconds is None:
        cache_ = getattr(config, "cache", None)  # None under -p no:cacheprovider
        file_seconds = cache_.get(CACHE_KEY, {}) if cache_ is not None else {}

    class ByScope(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid, root)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call: the work queue is complete
                order = longest_first(list(self.workqueue), file_seconds, root)
                self.workqueue = OrderedDict((scope, self.workqueue[scope]) for scope in order)
                self.ordered = True
            super()._assign_work_unit(node)

    return ByScope(config, log)
