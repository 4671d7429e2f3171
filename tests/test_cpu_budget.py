"""The learner's CPU budget: affinity, cgroup v2/v1 quotas, a spawner's CPU_LIMIT/CPU_GUARANTEE, the
learner's own override; odd values are notes, never errors; workers get their share as torch threads."""

from __future__ import annotations

import os

import pytest

import ppkit
from ppkit.cluster.budget import BUDGET_ENV, CpuBudget, read_budget


def v2(tmp_path, text):
    (tmp_path / "cpu.max").write_text(text)
    return tmp_path


def v1(tmp_path, quota, period="100000"):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(quota)
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(period)
    return tmp_path


def test_without_limits_the_budget_is_the_cores_this_process_may_run_on(tmp_path):
    budget = read_budget({}, root=tmp_path, affinity=8)
    assert budget.cores == 8 and "may run on" in budget.source and budget.notes == ()


def test_a_cgroup_v2_quota_is_a_budget_of_fractional_cores(tmp_path):
    budget = read_budget({}, root=v2(tmp_path, "150000 100000\n"), affinity=64)
    assert budget.cores == 1.5 and "cpu.max" in budget.source
    assert read_budget({}, root=v2(tmp_path, "max 100000\n"), affinity=64).cores == 64


def test_a_cgroup_v1_quota_counts_too(tmp_path):
    assert read_budget({}, root=v1(tmp_path, "200000"), affinity=64).cores == 2
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert read_budget({}, root=tmp_path, affinity=64).cores == 64


def test_the_spawners_guarantee_is_the_fair_share_and_the_limit_a_cap(tmp_path):
    assert read_budget({"CPU_LIMIT": "2", "CPU_GUARANTEE": "0.5"}, root=tmp_path, affinity=32).cores == 0.5
    budget = read_budget({"CPU_LIMIT": "3"}, root=tmp_path, affinity=32)
    assert budget.cores == 3 and budget.source.startswith("CPU_LIMIT=3")
    assert read_budget({"CPU_LIMIT": "64"}, root=tmp_path, affinity=4).cores == 4  # the smallest wins


@pytest.mark.parametrize("value", ["abc", "0", "-2", "nan", "inf", ""])
def test_odd_values_are_notes_that_say_what_was_read_never_errors(tmp_path, value):
    budget = read_budget({"CPU_LIMIT": value}, root=tmp_path, affinity=4)
    assert budget.cores == 4
    if value:
        assert any(f"CPU_LIMIT={value!r}" in note for note in budget.notes)
    odd = read_budget({}, root=v2(tmp_path, "lots 100000"), affinity=4)
    assert odd.cores == 4 and "not a number" in " ".join(odd.notes)


def test_the_learner_can_always_override(tmp_path):
    budget = read_budget({BUDGET_ENV: "6", "CPU_LIMIT": "1"}, root=v2(tmp_path, "50000 100000"), affinity=2)
    assert budget.cores == 6 and "set by you" in budget.source
    assert read_budget({BUDGET_ENV: "zero", "CPU_LIMIT": "1"}, root=tmp_path, affinity=2).cores == 0.5  # the cgroup


def test_each_worker_gets_its_share_at_least_one_thread():
    assert CpuBudget(8, "x").threads_per_worker(4) == 2
    assert CpuBudget(1.5, "x").threads_per_worker(4) == 1
    assert CpuBudget(3, "x").threads_per_worker(0) == 3


def _threads(rank, world_size):
    import torch

    return torch.get_num_threads(), torch.get_num_interop_threads()


@pytest.mark.slow
def test_workers_take_their_share_as_torch_threads_and_the_repr_says_where_it_came_from(monkeypatch, no_leftovers):
    monkeypatch.setenv(BUDGET_ENV, "4")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with ppkit.Cluster(2) as cluster:
        assert cluster.run(_threads) == [(2, 2), (2, 2)]
        assert f"cpu_budget='4 core(s) ({BUDGET_ENV}=4, set by you)'" in repr(cluster)
    with ppkit.Cluster(2, env={"OMP_NUM_THREADS": "1"}) as cluster:  # the learner's own setting stays
        assert cluster.run(_threads)[0][0] == 1
    assert os.environ[BUDGET_ENV] == "4"


def test_where_nothing_limits_the_learner_torchs_default_stays(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert read_budget({}, root=tmp_path, affinity=8).threads_per_worker(4) is None
    assert read_budget({"CPU_LIMIT": "4"}, root=tmp_path, affinity=8).threads_per_worker(4) == 1
    assert read_budget({}, root=tmp_path, affinity=8).threads_per_worker(4, {"OMP_NUM_THREADS": "3"}) == 3
