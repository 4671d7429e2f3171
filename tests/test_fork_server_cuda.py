"""The fork server never touches CUDA before it forks a rank (issue 49, item 5): a rank forked from a process that
ran ``cudaGetDeviceCount`` (``torch.cuda.is_available``) or initialised CUDA cannot use its GPU ("Cannot
re-initialize CUDA in forked subprocess"), which is ``notebook_launcher``'s best-known failure on Colab and Kaggle.

No GPU here, so a ``sitecustomize`` (on PYTHONPATH, which every process a launcher starts inherits) wraps, in each
process, the ``torch.cuda`` functions that would: ``is_available``, ``device_count`` (NVML first, else
cudaGetDeviceCount), ``init`` and ``_lazy_init``. A forked rank inherits what its fork server recorded before the
fork, and reports it: the first ranks (forked before the server's preload of torch._dynamo) and later ones. Each
also reports torch's own verdict, ``torch.cuda._is_in_bad_fork()``: torch here is a CUDA build, whose
cudaGetDeviceCount arms the fork poisoning even without a driver, as it does on a GPU machine.
"""

from __future__ import annotations

import os

import pytest
import torch

import ppkit

pytestmark = pytest.mark.slow  # fork servers of their own
TESTS = os.path.dirname(__file__)

RECORDER = '''
import os, traceback
if os.environ.get("PPKIT_TEST_CUDA_CALLS"):
    import torch.cuda
    torch.cuda.ppkit_test_calls = []
    def _recording(name, fn):
        def wrapper(*args, **kwargs):
            where = [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]]
            torch.cuda.ppkit_test_calls.append([name, os.getpid()] + where[-6:])
            return fn(*args, **kwargs)
        return wrapper
    for _name in ("is_available", "device_count", "init", "_lazy_init"):
        setattr(torch.cuda, _name, _recording(_name, getattr(torch.cuda, _name)))
'''


def inherited_cuda_calls(rank, world_size):
    """What this rank's process recorded before its own code ran: its fork server's calls (a rank's own start,
    worker.py, may ask CUDA: it is the process that will use it)."""
    inherited = [call for call in torch.cuda.ppkit_test_calls if call[1] != os.getpid()]
    return inherited + (["torch.cuda._is_in_bad_fork()"] if torch.cuda._is_in_bad_fork() else [])


def print_inherited(i):
    print("INHERITED", inherited_cuda_calls(i, 2))


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(RECORDER)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("PPKIT_TEST_CUDA_CALLS", "1")


def test_the_fork_server_asks_no_cuda_before_it_forks(recorded, capfd):
    from ppkit.cluster.spawn import call as spawn_call

    spawn_call.close()  # ppkit.spawn's kept fork servers, if any, were started without the recorder
    with ppkit.Cluster(2, "gloo", timeout=120) as cluster:
        assert cluster.run(inherited_cuda_calls) == [[], []]
        cluster.restart()  # a second generation of forks, after the server's first ones
        assert cluster.run(inherited_cuda_calls) == [[], []]
    for _ in range(2):  # ppkit.spawn forks anew each call; the second after the server preloaded torch._dynamo
        ppkit.spawn(print_inherited, nprocs=2)
    lines = [line for line in capfd.readouterr().out.splitlines() if "INHERITED" in line]
    assert len(lines) == 4 and all(line.endswith("INHERITED []") for line in lines), lines


def test_a_fork_server_that_asked_cuda_is_caught(recorded, tmp_path, monkeypatch):
    """The check above can fail: a module the fork server imports between two forks (PPKIT_PRELOAD, imported once
    the first ranks are forked) that calls is_available is handed on to the next ranks, and seen there."""
    (tmp_path / "asks_cuda.py").write_text("import torch\ntorch.cuda.is_available()\n")
    monkeypatch.setenv("PPKIT_PRELOAD", "asks_cuda")
    with ppkit.Cluster(2, "gloo", timeout=120) as cluster:
        assert cluster.run(inherited_cuda_calls) == [[], []]  # forked before the preload
        cluster.restart()
        second = cluster.run(inherited_cuda_calls)
    assert all(calls[0][0] == "is_available" and "asks_cuda.py" in str(calls[0]) for calls in second), second
    assert all(calls[-1] == "torch.cuda._is_in_bad_fork()" for calls in second), second  # torch's own verdict


def test_the_remote_agent_asks_no_cuda_before_it_forks(recorded):
    """``ppkit worker`` (the agent on another machine, here this one) forks its ranks as the fork server does."""
    import subprocess
    import sys

    from ppkit.cluster.worker_setup import free_port

    port, key = free_port(), os.urandom(32).hex()
    agent = subprocess.Popen([sys.executable, "-m", "ppkit", "worker", "--connect", f"127.0.0.1:{port}",
                              "--name", "worker1"], env={**os.environ, "PPKIT_KEY": key,  # + this module, by name
                                                         "PYTHONPATH": f"{os.environ['PYTHONPATH']}:{TESTS}"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with ppkit.Cluster(1, "gloo", listen=f"127.0.0.1:{port}", remote=["worker1"], key=key,
                           start_timeout=90, timeout=120) as cluster:
            assert cluster.run(inherited_cuda_calls) == [[]]
        agent.wait(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
