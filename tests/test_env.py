"""read_launch_env: torchrun and SLURM variables, host list expansion, and every error path."""

from __future__ import annotations

import pytest

from ppkit.cluster.tools.env import DEFAULT_MASTER_PORT, expand_nodelist, read_launch_env
from ppkit.errors import ConfigError

TORCHRUN = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5",
            "MASTER_PORT": "29511"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
         "SLURM_NODELIST": "node[03-05,07]"}


def test_torchrun_variables():
    env = read_launch_env(TORCHRUN)
    assert (env.rank, env.world_size, env.local_rank) == (3, 4, 1)
    assert (env.master_addr, env.master_port, env.source) == ("10.0.0.5", 29511, "torchrun")
    assert env.init_method == "tcp://10.0.0.5:29511"
    assert env.as_torchrun_env() == TORCHRUN


def test_slurm_variables_map_to_torchrun_names():
    env = read_launch_env(SLURM)
    assert (env.rank, env.world_size, env.local_rank, env.source) == (5, 8, 1, "slurm")
    assert env.master_addr == "node03"  # first host of the expanded list
    assert env.hosts == ("node03", "node04", "node05", "node07")
    assert env.master_port == DEFAULT_MASTER_PORT
    assert env.as_torchrun_env()["RANK"] == "5"


def test_slurm_job_nodelist_and_explicit_master():
    base = {k: v for k, v in SLURM.items() if k != "SLURM_NODELIST"}
    env = read_launch_env({**base, "SLURM_JOB_NODELIST": "gpu1", "MASTER_ADDR": "login2",
                           "MASTER_PORT": "1234"})
    assert (env.master_addr, env.master_port, env.hosts) == ("login2", 1234, ("gpu1",))


def test_torchrun_wins_inside_srun():
    # srun torchrun ...: SLURM_PROCID numbers the torchrun agents, RANK the training processes
    env = read_launch_env({**SLURM, **TORCHRUN})
    assert env.source == "torchrun" and env.rank == 3


def test_reads_os_environ_by_default(monkeypatch):
    for name in list(TORCHRUN) + list(SLURM):
        monkeypatch.delenv(name, raising=False)
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert read_launch_env().rank == 3


def test_ipv6_master_in_init_method():
    env = read_launch_env({**TORCHRUN, "MASTER_ADDR": "fd00::1"})
    assert env.init_method == "tcp://[fd00::1]:29511"


@pytest.mark.parametrize("nodelist, hosts", [
    ("node01", ["node01"]),
    ("node[03-05,07]", ["node03", "node04", "node05", "node07"]),
    ("node[08-10]", ["node08", "node09", "node10"]),
    ("gpu[1-2],cpu7", ["gpu1", "gpu2", "cpu7"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a[9-11]-ib", ["a9-ib", "a10-ib", "a11-ib"]),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, words", [
    ("", "empty"),
    ("node[01-03", "'[' without ']'"),
    ("node01]", "']' without '['"),
    ("node[05-03]", "runs backwards"),
    ("node[a-b]", "is not a number"),
    ("n[[1]]", "nested"),
    ("a,,b", "empty host name"),
])
def test_bad_nodelists(nodelist, words):
    with pytest.raises(ConfigError, match="SLURM_NODELIST") as info:
        expand_nodelist(nodelist) if nodelist else read_launch_env({**SLURM, "SLURM_NODELIST": "  "})
    assert words in str(info.value)


def test_nothing_set():
    with pytest.raises(ConfigError, match="no launcher variables found.*torchrun.*srun"):
        read_launch_env({"HOME": "/root"})


def test_torchrun_incomplete_names_what_is_missing():
    with pytest.raises(ConfigError, match="RANK set but WORLD_SIZE, LOCAL_RANK, MASTER_ADDR missing"):
        read_launch_env({"RANK": "0"})


def test_slurm_incomplete_names_what_is_missing():
    with pytest.raises(ConfigError, match="SLURM_LOCALID missing"):
        read_launch_env({k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"})


@pytest.mark.parametrize("change, words", [
    ({"RANK": "4"}, "RANK=4 but WORLD_SIZE=4"),
    ({"LOCAL_RANK": "9"}, "LOCAL_RANK=9 but WORLD_SIZE=4"),
    ({"RANK": "x"}, "RANK='x' is not a whole number"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({"RANK": "-1"}, "RANK=-1 must be at least 0"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
    ({"MASTER_PORT": "abc"}, "MASTER_PORT='abc' is not a TCP port"),
])
def test_inconsistent_torchrun_values(change, words):
    with pytest.raises(ConfigError) as info:
        read_launch_env({**TORCHRUN, **change})
    assert words in str(info.value)


def test_inconsistent_slurm_values():
    with pytest.raises(ConfigError, match="SLURM_PROCID=8 but SLURM_NTASKS=8"):
        read_launch_env({**SLURM, "SLURM_PROCID": "8"})


def test_module_prints_one_json_line(monkeypatch, capsys):
    import json

    from ppkit.cluster.tools import env as env_module

    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    assert env_module.main() == 0
    record = json.loads(capsys.readouterr().out)
    assert record["rank"] == 3 and record["source"] == "torchrun"


def test_module_reports_missing_variables(monkeypatch, capsys):
    from ppkit.cluster.tools import env as env_module

    for name in list(TORCHRUN) + list(SLURM) + ["SLURM_JOB_NODELIST"]:
        monkeypatch.delenv(name, raising=False)
    assert env_module.main() == 2
    assert "no launcher variables found" in capsys.readouterr().err
