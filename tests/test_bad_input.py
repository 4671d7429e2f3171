"""Bad input never destroys work: every public entry point and CLI flag refuses a bad value with a
ConfigError that says what to write, and a bad second ``ppkit.start``/``ppkit.start_rpc`` leaves the
running cluster or RPC world working, with no process added or removed."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from leftovers import ppkit_children, wait_gone
from torch.distributed import rpc

import ppkit
from ppkit import cli
from ppkit.cluster import session, worker_setup
from ppkit.cluster.launchers import local as local_launcher
from ppkit.pipeline.rpc import PipelineModel
from ppkit.pipeline.rpc.config import PipelineConfig
from ppkit.transport import channel

REPO = Path(__file__).resolve().parents[1]
KEY = "ab" * 16
TOO_MANY = worker_setup.MAX_RANKS_PER_CORE * (os.cpu_count() or 1) + 1
NAN, INF = math.nan, math.inf

# (options, what the message must say): each is refused by ppkit.start and by ppkit.Cluster
BAD_CLUSTER_OPTIONS = [
    ({"timeout": NAN}, "timeout must be a positive number of seconds, got nan; write a finite number"),
    ({"timeout": INF}, "timeout must be a positive number of seconds, got inf"),
    ({"start_timeout": -INF}, "start_timeout must be a positive number of seconds, got -inf"),
    ({"start_timeout": True}, "start_timeout must be a positive number of seconds, got True"),
    ({"env": {"OMP_NUM_THREADS": 1}}, r"env values must be strings, as in os.environ .*\{'OMP_NUM_THREADS': '1'\}"),
    ({"env": ["OMP_NUM_THREADS=1"]}, "env must be a dict of variable names to strings"),
    ({"labels": ["only one"]}, r"labels must be a list of 2 strings, one per rank.*got \['only one'\]"),
    ({"labels": "ab"}, "labels must be a list of 2 strings"),
    ({"remote": ["worker1"]}, r"remote= only applies to workers on other machines, which need listen='ADDR:PORT'"),
    ({"key": KEY}, "key= only applies to workers on other machines.*drop key="),
    ({"remote": 1, "key": KEY}, "remote= and key= only apply"),
    ({"listen": "127.0.0.1:99999"}, "listen must be 'ADDR:PORT' with a port from 0 to 65535"),
    ({"listen": "127.0.0.1:29600", "backend": "nccl"}, "remote workers use the gloo backend"),
    ({"process_group": "yes"}, "process_group must be True .* or False"),
]


@pytest.fixture
def nothing_may_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started before the arguments were checked")

    monkeypatch.setattr(local_launcher, "start_fork_server", refuse)


def call(entry, options):
    options = dict(options)
    backend = options.pop("backend", "gloo")
    return entry(2, backend, **options)


@pytest.mark.parametrize("options, message", BAD_CLUSTER_OPTIONS)
@pytest.mark.parametrize("entry", [ppkit.start, ppkit.Cluster])
def test_bad_cluster_options_are_refused_before_anything_starts(nothing_may_start, entry, options, message):
    with pytest.raises(ppkit.ConfigError, match=message):
        call(entry, options)


def test_an_unknown_keyword_names_the_closest_option(nothing_may_start):
    with pytest.raises(ppkit.ConfigError, match=r"ppkit.start\(\) has no option 'timout'; did you mean timeout=\?"):
        ppkit.start(2, timout=5)
    with pytest.raises(ppkit.ConfigError, match=r"has no option 'workers'; It takes: world_size, backend, timeout"):
        ppkit.start(2, workers=3)


@pytest.mark.parametrize("entry", [ppkit.start, ppkit.Cluster, ppkit.start_rpc])
def test_world_size_has_an_upper_bound(nothing_may_start, entry):
    with pytest.raises(ppkit.ConfigError, match=f"world_size {TOO_MANY} is more than 64 ranks per CPU core"):
        entry(TOO_MANY)
    assert worker_setup.check_world_size(TOO_MANY - 1) == TOO_MANY - 1


BAD_RPC_OPTIONS = [
    ({"rpc_timeout": NAN}, "rpc_timeout must be a positive number of seconds, got nan"),
    ({"rpc_timeout": -1}, "rpc_timeout must be a positive number of seconds, got -1"),
    ({"start_timeout": INF}, "start_timeout must be a positive number of seconds, got inf"),
    ({"num_worker_threads": 0}, "num_worker_threads must be a positive whole number"),
    ({"env": {"A": 1.5}}, "env values must be strings"),
    ({"remote": 1}, "remote= only applies to workers on other machines"),
    ({"listen": "127.0.0.1:70000"}, "port from 0 to 65535"),
]


@pytest.mark.parametrize("options, message", [
    *BAD_RPC_OPTIONS,
    ({"rpc_timout": 5}, r"ppkit.start_rpc\(\) has no option 'rpc_timout'; did you mean rpc_timeout=\?"),
])
def test_bad_start_rpc_options_are_refused_before_anything_starts(nothing_may_start, options, message):
    with pytest.raises(ppkit.ConfigError, match=message):
        ppkit.start_rpc(2, **options)


@pytest.mark.parametrize("options, message", BAD_RPC_OPTIONS)
def test_bad_rpc_world_options_are_refused_before_anything_starts(nothing_may_start, options, message):
    with pytest.raises(ppkit.ConfigError, match=message):
        ppkit.RpcWorld(2, **options)


# -- a bad second call keeps the first one working ------------------------------------------------
SECOND_START_MISTAKES = [
    lambda: ppkit.start(2, timout=5),
    lambda: ppkit.start(2, timeout=-1),
    lambda: ppkit.start(2, timeout=NAN),
    lambda: ppkit.start(2, start_timeout=INF),
    lambda: ppkit.start(2, env={"OMP_NUM_THREADS": 1}),
    lambda: ppkit.start(3, labels=["a", "b"]),
    lambda: ppkit.start(2, key=KEY),
    lambda: ppkit.start(2, listen="127.0.0.1:99999"),
    lambda: ppkit.start(TOO_MANY),
]


def test_a_bad_second_start_keeps_the_running_cluster(no_leftovers):
    cluster = ppkit.start(2, "gloo", timeout=30)
    before = sorted(p.pid for p in ppkit_children())
    try:
        for mistake in SECOND_START_MISTAKES:
            with pytest.raises(ppkit.ConfigError):
                mistake()
            assert session.active() is cluster and cluster.state == "ready"
        assert cluster.run(lambda rank, world_size: rank * 10) == [0, 10]
        assert sorted(p.pid for p in ppkit_children()) == before  # none started, none stopped
    finally:
        cluster.close()
    assert not wait_gone(before)


SECOND_RPC_MISTAKES = [
    (lambda: ppkit.start_rpc(2, rpc_timout=5), ppkit.ConfigError),
    (lambda: ppkit.start_rpc(2, rpc_timeout=-1), ppkit.ConfigError),
    (lambda: ppkit.start_rpc(2, rpc_timeout=NAN), ppkit.ConfigError),
    (lambda: ppkit.start_rpc(2, env={"A": 1}), ppkit.ConfigError),
    (lambda: ppkit.start_rpc(2, key=KEY), ppkit.ConfigError),
    # conftest's first RPC world had 2 workers: torch keeps its table for the whole process
    (lambda: ppkit.start_rpc(3), ppkit.ClusterStateError),
]


def test_a_bad_second_start_rpc_keeps_the_running_world(no_leftovers):
    world = ppkit.start_rpc(2, rpc_timeout=20)
    before = sorted(p.pid for p in ppkit_children())
    try:
        for mistake, error in SECOND_RPC_MISTAKES:
            with pytest.raises(error):
                mistake()
            assert world.state == "ready"
        assert rpc.rpc_sync("worker2", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]
        assert sorted(p.pid for p in ppkit_children()) == before
    finally:
        world.close()
    assert not wait_gone(before)


@pytest.mark.parametrize("timeout", [NAN, INF, True])
def test_run_refuses_nan_inf_and_bool_timeouts(cluster2, timeout):
    with pytest.raises(ppkit.ConfigError, match="timeout must be a positive number of seconds"):
        cluster2.run(lambda rank, world_size: rank, timeout=timeout)
    assert cluster2.run(lambda rank, world_size: rank) == [0, 1]


def test_ranks_magic_refuses_a_nan_timeout(cluster2):
    options = session.parse_line("--timeout nan")  # float() reads it; run() refuses it
    with pytest.raises(ppkit.ConfigError, match="got nan"):
        cluster2.run(lambda rank, world_size: rank, **options)


# -- the pipeline lesson's classes ---------------------------------------------------------------
@pytest.mark.parametrize("sizes", [4, "48", None])
def test_microbatch_sizes_must_be_a_list(sizes):
    with pytest.raises(ppkit.ConfigError, match=f"microbatch_sizes is a list of sizes to try, got {sizes!r}: "
                                                f"write microbatch_sizes=\\({sizes!r},\\)"):
        PipelineConfig(microbatch_sizes=sizes)
    assert PipelineConfig(microbatch_sizes=[4]).microbatch_sizes == (4,)


@pytest.mark.parametrize("timeout", [True, NAN, INF, 0])
def test_pipeline_model_refuses_bad_timeouts(timeout):
    # refused before it looks for an RPC world, so none is needed here
    with pytest.raises(ppkit.ConfigError, match="timeout must be a positive number of seconds"):
        PipelineModel("worker1:cpu,worker2:cpu", timeout=timeout)


# -- CLI flags: one line, status 2, no traceback -------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["worker", "--connect", "10.0.0.1:99999", "--name", "w1", "--key", KEY],
     "ppkit worker: error: --connect must be ADDR:PORT, e.g. 10.0.0.1:29600; the port must be from 1 to 65535"),
    (["worker", "--connect", "10.0.0.1:0", "--name", "w1", "--key", KEY], "the port must be from 1 to 65535, got 0"),
    (["worker", "--connect", "10.0.0.1:29600", "--name", "w1", "--key", KEY, "--timeout", "nan"],
     "ppkit worker: error: --timeout must be a positive number of seconds, got nan"),
    (["worker", "--connect", "10.0.0.1:29600", "--name", "w1", "--key", KEY, "--timeout", "inf"],
     "--timeout must be a positive number of seconds, got inf"),
    (["worker", "--name", "w1", "--port", "70000"], "ppkit worker: error: --port must be a port from 1 to 65535"),
    (["master", "--listen", "127.0.0.1:99999"],
     "ppkit master: error: listen must be 'ADDR:PORT' with a port from 0 to 65535"),
    (["master", "--listen", "127.0.0.1:29600", "--start-timeout", "nan"],
     "ppkit master: error: --start-timeout must be a positive number of seconds, got nan"),
    (["master", "--listen", "127.0.0.1:29600", "--local-ranks", "-1"],
     "ppkit master: error: --local-ranks must be 0 or more, got -1"),
    (["master", "--listen", "127.0.0.1:29600", "--key", "abcd"], "ppkit master: error: the key must be at least 16"),
    (["pipeline", "--start-timeout", "nan"], "ppkit pipeline: error: --start-timeout must be a positive number"),
    (["bench", "--world-size", str(TOO_MANY)], f"ppkit bench: error: world_size {TOO_MANY} is more than 64 ranks"),
    (["doctor", "--master", "127.0.0.1:99999"],
     "ppkit doctor: error: --master must be ADDR:PORT, e.g. 10.0.0.1:29600; got '127.0.0.1:99999'"),
])
def test_cli_flags_give_one_error_line_and_status_2(nothing_may_start, capsys, argv, message):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"ppkit {argv[0]}: error: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err and out == ""


def test_cli_error_as_a_user_sees_it():
    proc = subprocess.run([sys.executable, "-m", "ppkit", "worker", "--connect", "h:99999", "--name", "w1",
                           "--key", KEY], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("ppkit worker: error: --connect must be ADDR:PORT") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ["h:99999", "h:65536", "h:0", "h:-1", "h"])
def test_parse_address_refuses_ports_out_of_range(text):
    with pytest.raises(ValueError):
        channel.parse_address(text)
    assert channel.parse_address("h:65535") == ("h", 65535)
