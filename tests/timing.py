"""Where the suite's time went: a table at the end of every run, by kind of test, by file and by test.

Each test's time is the wall time of its whole run (setup, call, teardown), so a fixture's start (a browser, a
hub, the SLURM testbed, a module's cluster) counts for the first test that uses it, and the kinds add up to the
run. Registered by the repository's conftest.py.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import PurePosixPath

import pytest

TOP = 15
# First match wins: the components a test starts for real, then what is left.
KINDS = ("hub", "browser", "SLURM", "two-host", "notebooks", "unit")


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
        self.started = time.monotonic()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        start = time.monotonic()
        try:
            return (yield)
        finally:
            self.tests[item.nodeid] = (kind_of(item), time.monotonic() - start)

    def rows(self) -> tuple[list, list, list]:
        by_kind, by_file, counts = defaultdict(float), defaultdict(float), defaultdict(int)
        for nodeid, (kind, seconds) in self.tests.items():
            by_kind[kind] += seconds
            counts[kind] += 1
            by_file[nodeid.split("::", 1)[0]] += seconds
        kinds = [(k, counts[k], by_kind[k]) for k in KINDS if k in by_kind]
        files = sorted(by_file.items(), key=lambda kv: -kv[1])[:TOP]
        tests = sorted(((n, s) for n, (_, s) in self.tests.items()), key=lambda kv: -kv[1])[:TOP]
        return kinds, files, tests

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        if not self.tests:
            return
        total = time.monotonic() - self.started
        kinds, files, tests = self.rows()
        write = terminalreporter.write_line
        terminalreporter.section("where the time went")
        write(f"{'kind':<12}{'tests':>7}{'seconds':>10}{'share':>8}")
        for kind, count, seconds in kinds:
            write(f"{kind:<12}{count:>7}{seconds:>10.1f}{seconds / total:>8.0%}")
        write(f"{'(all)':<12}{len(self.tests):>7}{total:>10.1f}   (pytest's wall time, collection included)")
        write("")
        write(f"top {len(files)} files by seconds:")
        for name, seconds in files:
            write(f"{seconds:>9.1f}  {name}")
        write("")
        write(f"top {len(tests)} tests by seconds (setup and teardown included):")
        for name, seconds in tests:
            write(f"{seconds:>9.1f}  {name}")
