"""What ppkit needs from torch beyond its public API: present on the pinned torch, named when missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch.distributed.rpc as rpc

import ppkit
from ppkit import compat
from ppkit.errors import ClusterStateError

BLOCK_PIPELINING = "import sys; sys.modules['torch.distributed.pipelining'] = None; "


def test_the_pinned_torch_has_every_rpc_internal_ppkit_aligns():
    assert compat.missing_rpc_internals() == []
    compat.require_rpc_internals()
    compat.require_pipelining()


def test_a_torch_without_an_rpc_internal_is_refused_before_any_process_starts(monkeypatch):
    monkeypatch.delattr(rpc, "_init_counter")
    assert compat.missing_rpc_internals() == ["torch.distributed.rpc._init_counter"]
    with pytest.raises(ClusterStateError) as info:
        ppkit.start_rpc(2)
    message = str(info.value)
    assert "torch.distributed.rpc._init_counter" in message
    assert "wait forever" in message and "pip install" in message
    assert ppkit.cluster.rpc.world.active() is None or not ppkit.cluster.rpc.world.active().alive


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_importing_ppkit_pipelining_without_torch_pipelining_says_which_torch_has_it():
    done = _run(BLOCK_PIPELINING + "import ppkit.pipeline.schedules.sweep")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ppkit.errors.ClusterStateError: ppkit.pipeline.schedules (GPipe and 1F1B")
    assert "appeared in torch 2.4" in last and "--schedule rpc" in last


@pytest.mark.slow
def test_the_cli_schedule_gpipe_without_torch_pipelining_ends_with_one_clear_line():
    done = _run(BLOCK_PIPELINING + "from ppkit.cli import main; sys.exit(main(['pipeline', '--schedule', 'gpipe']))")
    assert done.returncode != 0
    assert "appeared in torch 2.4" in done.stderr
    assert "Traceback" not in done.stderr
