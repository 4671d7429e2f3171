"""Where the suite's time went: a table at the end of every run, by kind of test, by file and by test.

Each test's time is that of its whole run (setup, call and teardown, as pytest's reports time them), so a
fixture's start (a browser, a hub, the SLURM testbed, a module's cluster) counts for the first test that uses it.
With pytest-xdist's workers (`make test` runs two, tests/scheduling.py) the table is made where the reports
arrive: the seconds of the kinds add up to the workers' busy time, about the workers times pytest's wall time,
and a last line says how busy each worker was. Registered by the repository's conftest.py.

Each file's seconds are also kept in pytest's cache (``.pytest_cache``, under CACHE_KEY), where the next run's
scheduler (tests/scheduling.py) reads them to hand out the longest files first.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import PurePosixPath

import pytest

TOP = 15
# First match wins: the components a test starts for real, then what is left.
KINDS = ("hub", "browser", "SLURM", "two-host", "notebooks", "unit")
CACHE_KEY = "ppkit/file_seconds"  # {test file or notebook: its seconds in the last run that ran it}


def kind_of(item: pytest.Item) -> str:
    path = PurePosixPath(item.nodeid.split("::", 1)[0])
    names = set(getattr(item, "fixturenames", ()))
    if "hub" in names or path.name.startswith("test_hub"):
        return "hub"
    if "browser" in path.parts:
        return "browser"
    if path.suffix == ".ipynb":
        return "notebooks"
    if names & {"slurm", "slurm_clean", "slurm_restore_nodes"} or item.get_closest_marker("slurm"):
        return "SLURM"
    if "two_hosts" in names:
        return "two-host"
    return "unit"


class TimeTable:
    def __init__(self) -> None:
        self.tests: dict[str, tuple[str, float]] = {}  # nodeid -> (kind, seconds)
        self.workers: dict[str, float] = defaultdict(float)  # xdist worker ("gw0") or "pytest" -> busy seconds
        self.started = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem) -> None:
        """Where the test runs (a worker, or the one pytest): its kind travels in its reports."""
        item.user_properties.append(("kind", kind_of(item)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Where the reports arrive (xdist's controller, or the one pytest): add up each phase's seconds."""
        kind = dict(report.user_properties).get("kind", "unit")
        _, seconds = self.tests.get(report.nodeid, (kind, 0.0))
        self.tests[report.nodeid] = (kind, seconds + report.duration)
        node = getattr(report, "node", None)  # xdist's WorkerController, on the controller only
        self.workers[node.gateway.id if node is not None else "pytest"] += report.duration

    def file_seconds(self) -> dict[str, float]:
        by_file: dict[str, float] = defaultdict(float)
        for nodeid, (_, seconds) in self.tests.items():
            by_file[nodeid.split("::", 1)[0]] += seconds
        return dict(by_file)

    def rows(self) -> tuple[list, list, list]:
        by_kind, counts = defaultdict(float), defaultdict(int)
        for kind, seconds in self.tests.values():
            by_kind[kind] += seconds
            counts[kind] += 1
        kinds = [(k, counts[k], by_kind[k]) for k in KINDS if k in by_kind]
        files = sorted(self.file_seconds().items(), key=lambda kv: -kv[1])[:TOP]
        tests = sorted(((n, s) for n, (_, s) in self.tests.items()), key=lambda kv: -kv[1])[:TOP]
        return kinds, files, tests

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Where the reports arrive: keep each file's seconds for the next run's scheduler (a file this run did
        not run keeps its older entry; one it ran in part, under -k, is kept as measured)."""
        cache = getattr(session.config, "cache", None)  # None under -p no:cacheprovider
        if not self.tests or cache is None or hasattr(session.config, "workerinput"):
            return
        cache.set(CACHE_KEY, {**cache.get(CACHE_KEY, {}), **self.file_seconds()})

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        if not self.tests or hasattr(config, "workerinput"):  # a worker's summary is not shown
            return
        wall = time.monotonic() - self.started
        kinds, files, tests = self.rows()
        busy = sum(self.workers.values())
        write = terminalreporter.write_line
        terminalreporter.section("where the time went")
        write(f"{'kind':<12}{'tests':>7}{'seconds':>10}{'share':>8}")
        for kind, count, seconds in kinds:
            write(f"{kind:<12}{count:>7}{seconds:>10.1f}{seconds / max(busy, 1e-9):>8.0%}")
        write(f"{'(all)':<12}{len(self.tests):>7}{busy:>10.1f}   (the tests' seconds, added up)")
        workers = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(self.workers.items()))
        write(f"pytest's wall time {wall:.1f} s, collection included; busy: {workers}")
        write("")
        write(f"top {len(files)} files by seconds:")
        for name, seconds in files:
            write(f"{seconds:>9.1f}  {name}")
        write("")
        write(f"top {len(tests)} tests by seconds (setup and teardown included):")
        for name, seconds in tests:
            write(f"{seconds:>9.1f}  {name}")
