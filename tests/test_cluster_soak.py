"""A small soak (benchmarks/bench_soak.py): 10 calls, 2 with a rank killed, so CI keeps the
properties: each kill ends as a WorkerDiedError within 5 s, restart() always works, and nothing
(process, thread, file descriptor) is left once the cluster is closed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_soak  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # slow: make test-fast leaves it out


def test_a_short_soak_keeps_every_property(no_leftovers):
    report = bench_soak.soak(calls=10, world_size=4, kill_every=5, seed=1, say=lambda *a, **k: None)
    assert report["failures"] == [], bench_soak.format_report(report)
    assert report["kills"] == report["died_errors"] == report["restarts"] == 2
    assert report["ok_calls"] == 8
    assert max(report["times_to_error"]) < bench_soak.DIED_WITHIN_S
    assert not any(report["leftovers"].values())
