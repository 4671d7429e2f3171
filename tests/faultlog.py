"""A crash log that outlives the test process, for hunting a rare hard crash (issue 23).

pytest captures file descriptor 2 around each test. When the process dies from a signal (SIGABRT,
SIGSEGV), what C and C++ code printed just before (glibc's malloc checks, libstdc++'s "terminate
called after throwing ...") dies with the capture file, and faulthandler's Python stacks go only to
the terminal. With ``PPKIT_FAULT_LOG=path`` set, tests/conftest.py registers ``FaultLog``:
faulthandler writes every thread's stack to that file, and each test's start and end are written
there too, so a crash in a loop of runs names the test that was running and the one before it.
scripts/crash_loop.sh runs a pytest command in such a loop and adds gdb's native stacks.
"""

from __future__ import annotations

import faulthandler


class FaultLog:
    def __init__(self, path: str):
        self.file = open(path, "w", buffering=1)  # noqa: SIM115 - open until the process ends

    def pytest_sessionstart(self, session) -> None:
        # not in pytest_configure: pytest's own faulthandler plugin enables itself there, last
        faulthandler.enable(file=self.file, all_threads=True)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.file.write(f"start {nodeid}\n")

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.file.write(f"end   {nodeid}\n")
