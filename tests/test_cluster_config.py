"""Bad arguments fail at once, before any process starts, with a message that says what to type."""

from __future__ import annotations

import threading

import pytest
from leftovers import wait_gone

import ppkit
from ppkit.cluster import worker_setup
from ppkit.cluster.launchers import local as local_launcher


@pytest.fixture
def nothing_may_start(monkeypatch):
    """Fail loudly if the code under test gets as far as starting the fork server."""

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started before the arguments were checked")

    monkeypatch.setattr(local_launcher, "start_fork_server", refuse)


@pytest.mark.parametrize("world_size, expected", [
    (0, "world_size must be at least 1, got 0"),
    (-1, "world_size must be at least 1, got -1"),
    ("2", "world_size must be a whole number of workers, got '2' (str)"),
    (True, "world_size must be a whole number of workers, got True (bool)"),
    (2.0, "world_size must be a whole number of workers, got 2.0 (float)"),
    (None, "world_size must be a whole number of workers, got None (NoneType)"),
])
@pytest.mark.parametrize("entry", [ppkit.start, ppkit.Cluster])
def test_bad_world_size(nothing_may_start, entry, world_size, expected):
    with pytest.raises(ppkit.ConfigError) as info:
        entry(world_size, "gloo")
    assert str(info.value).startswith(expected)
    assert "ppkit.start(2)" in str(info.value)  # what to type instead
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("backend", ["mpi", "GLOO", "", None, 3])
def test_unknown_backend(nothing_may_start, backend):
    with pytest.raises(ppkit.ConfigError) as info:
        ppkit.Cluster(2, backend)
    assert f"unknown backend {backend!r}" in str(info.value)
    assert "'gloo' runs on CPUs" in str(info.value)


def test_nccl_without_a_gpu_per_rank(nothing_may_start):
    too_many = worker_setup.gpu_count() + 1
    with pytest.raises(ppkit.ConfigError) as info:
        ppkit.Cluster(too_many, "nccl")
    expected = f"backend 'nccl' needs one GPU per rank: {too_many} ranks but {too_many - 1} GPU(s)"
    assert expected in str(info.value)
    assert "backend='gloo'" in str(info.value)


@pytest.mark.parametrize("gpus, world_size, expected", [(0, 2, "gloo"), (1, 2, "gloo"), (2, 2, "nccl"),
                                                        (4, 2, "nccl")])
def test_auto_picks_nccl_only_when_every_rank_has_a_gpu(gpus, world_size, expected):
    assert worker_setup.resolve_backend("auto", world_size, gpus=gpus) == expected


@pytest.mark.parametrize("option", ["timeout", "start_timeout"])
@pytest.mark.parametrize("value", [0, -1, "3", True, None])
def test_bad_timeouts(nothing_may_start, option, value):
    with pytest.raises(ppkit.ConfigError, match=f"{option} must be a positive number of seconds, got"):
        ppkit.Cluster(2, "gloo", **{option: value})


# -- run() arguments, on a real cluster that must keep working -------------------------------------
def make_greeting(rank, world_size):
    return f"hello from {rank}"


@pytest.mark.parametrize("not_a_function", [42, "make_greeting", None])
def test_run_needs_a_function(cluster2, not_a_function):
    with pytest.raises(ppkit.ConfigError, match="run\\(\\) needs a function to call on every rank") as info:
        cluster2.run(not_a_function)
    assert "cluster.run(my_fn), not cluster.run(my_fn())" in str(info.value)
    assert cluster2.state == "ready"


def test_run_with_the_result_of_calling_the_function(cluster2):
    with pytest.raises(ppkit.ConfigError, match="got str 'hello from 0'"):
        cluster2.run(make_greeting(0, 2))


def test_an_argument_that_cannot_be_sent_is_refused_before_anything_runs(cluster2):
    lock = threading.Lock()
    with pytest.raises(ppkit.ConfigError) as info:
        cluster2.run(lambda rank, world_size, held: rank, lock)
    assert "cannot send" in str(info.value) and "not open files, locks or process handles" in str(info.value)
    assert isinstance(info.value.__cause__, TypeError)
    assert cluster2.run(make_greeting) == ["hello from 0", "hello from 1"]


@pytest.mark.parametrize("timeout", [0, -5, "10"])
def test_run_with_a_bad_timeout(cluster2, timeout):
    with pytest.raises(ppkit.ConfigError, match="timeout must be a positive number of seconds"):
        cluster2.run(make_greeting, timeout=timeout)
    assert cluster2.run(make_greeting) == ["hello from 0", "hello from 1"]


def test_start_with_bad_arguments_keeps_the_running_cluster():
    cluster = ppkit.start(2, "gloo")
    pids = [w["pid"] for w in cluster.workers.values()]
    try:
        with pytest.raises(ppkit.ConfigError):
            ppkit.start(0)
        with pytest.raises(ppkit.ConfigError):
            ppkit.start(2, "mpi")
        with pytest.raises(ppkit.ConfigError):
            ppkit.start(2, timeout=-1)
        assert cluster.state == "ready" and cluster.run(lambda rank, world_size: rank) == [0, 1]
    finally:
        cluster.close()
    assert not wait_gone(pids)
