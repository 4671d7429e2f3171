"""The one SLURM testbed of a pytest session, shared by the `slurm` fixture and the notebooks' hook.

tests/conftest.py (the fixture) and the repository's conftest.py (nbval's notebooks get no fixtures)
both call ``testbed()``: the first call starts the cluster and puts its environment (SLURM_CONF) into
os.environ, so ppkit code, subprocesses and notebook kernels started later all reach it; ``stop()``
(pytest_sessionfinish, with config cleanup and atexit as backstops) stops it and restores os.environ.
A plain module, imported by this name from both conftest files, so both see the same instance.
"""

from __future__ import annotations

import atexit
import json
import os
import re
from pathlib import Path

from slurm_testbed import SlurmMissing, SlurmTestbed

USES_SLURM = re.compile(r"""launcher\s*=\s*["']slurm["']|\bsinfo\b""")
_testbed: SlurmTestbed | None = None
_failure: Exception | None = None  # a start that failed is not retried by every later test
_saved_env: dict[str, str | None] = {}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def testbed() -> SlurmTestbed:
    """The session's running testbed, started on first use; SlurmMissing or SlurmTestbedError otherwise."""
    global _testbed, _failure
    if _testbed is not None:
        return _testbed
    if _failure is not None:
        raise _failure
    try:
        tb = SlurmTestbed().start()
    except Exception as exc:
        _failure = exc
        raise
    _testbed = tb
    for key, value in tb.env.items():
        _saved_env[key] = os.environ.get(key)
        os.environ[key] = value
    atexit.register(stop)
    return tb


def missing_message(exc: SlurmMissing) -> str:
    """What a skipped (or, under CI=true, failed) SLURM test reports."""
    if in_ci():
        return f"{exc} CI=true, so the SLURM tests must run rather than skip."
    return f"{exc} Until then the SLURM tests are skipped."


def stop() -> None:
    """Stop the session's testbed, if one runs, and give os.environ back its SLURM variables; idempotent."""
    global _testbed
    tb, _testbed = _testbed, None
    if tb is None:
        return
    try:
        tb.stop()
    finally:
        for key, value in _saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _saved_env.clear()


def notebook_uses_slurm(path: Path) -> bool:
    """Whether any cell of this notebook mentions launcher="slurm" (or 'slurm') or sinfo."""
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return False
    return any(USES_SLURM.search("".join(cell.get("source", ""))) for cell in cells)
