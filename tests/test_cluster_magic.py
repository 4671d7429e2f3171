"""The %%ranks cell magic, driven through a real IPython shell as a notebook kernel would."""

from __future__ import annotations

import pytest

import ppkit
from ppkit.cluster import session


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


@pytest.fixture(scope="module")
def started(shell):
    cluster = ppkit.start(2, "gloo", timeout=30)  # registers %%ranks in the running shell
    yield cluster
    cluster.close()


def run_cell(shell, source: str):
    return shell.run_cell(source, store_history=False)


def test_ranks_runs_the_cell_on_every_rank_with_names_defined(shell, started, capsys):
    result = run_cell(shell, "%%ranks\n"
                             "t = torch.ones(1) * (rank + 1)\n"
                             "dist.all_reduce(t)\n"
                             "print(f'rank {rank} of {world_size}: {t.item()}')\n")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 of 2: 3.0" in out
    assert "[rank 1] rank 1 of 2: 3.0" in out


def test_names_a_cell_defines_stay_for_the_next_cell(shell, started, capsys):
    assert run_cell(shell, "%%ranks\nremembered = rank * 10\n").success
    assert run_cell(shell, "%%ranks\nprint('remembered', remembered)\n").success
    out = capsys.readouterr().out
    assert "[rank 0] remembered 0" in out and "[rank 1] remembered 10" in out


@pytest.mark.slow
def test_an_error_in_a_ranks_cell_names_the_rank_and_the_cell_line(shell, started):
    result = run_cell(shell, "%%ranks\nx = 1\nif rank == 1:\n    raise ValueError('only on one')\n")
    err = result.error_in_exec
    assert isinstance(err, ppkit.RemoteError)
    assert err.ranks == [1]
    assert "rank 1 raised ValueError: only on one" in str(err)
    assert "%%ranks cell" in err.tracebacks[1] and "line 3" in err.tracebacks[1]  # line 3 of the body
    assert started.state == "ready"


@pytest.mark.slow
def test_ranks_timeout_option(shell, started):
    result = run_cell(shell, "%%ranks --timeout 2\nif rank == 0:\n    dist.recv(torch.zeros(1), src=1)\n")
    assert isinstance(result.error_in_exec, ppkit.JobTimeoutError)
    assert result.error_in_exec.ranks == [0]
    started.restart()
    assert started.run(lambda rank, world_size: rank) == [0, 1]


@pytest.mark.parametrize("line", ["--timeout", "--timeout soon", "--verbose"])
def test_bad_ranks_options_are_config_errors(line):
    with pytest.raises(ppkit.ConfigError, match="%%ranks"):
        session.parse_line(line)


def test_ranks_without_a_cluster_says_to_start_one(monkeypatch):
    monkeypatch.setattr(session, "_active", None)
    with pytest.raises(ppkit.ClusterStateError, match=r"ppkit\.start"):
        session.ranks("", "print(rank)")
