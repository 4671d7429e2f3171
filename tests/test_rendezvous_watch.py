"""Workers watch torch's env:// and tcp:// rendezvous (ppkit/transport/rendezvous.py): the store they
host stays on 127.0.0.1, and a job that hangs after a process group was re-created on the same port
in the same processes says so (PyTorch issue 74666) and points to ppkit.spawn."""

from __future__ import annotations

import importlib
import os
from datetime import timedelta

import pytest
import torch

import ppkit
from ppkit.cluster import diagnostics
from ppkit.lessons.data_parallel import free_port
from ppkit.transport.messages import Rendezvous


@pytest.fixture(scope="module")
def bare():
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        yield cluster


def _join(rank, world_size, port, host="localhost"):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=30))


def join_and_leave(rank, world_size, port):
    """A group on ``port`` over env://: where rank 0's store listens, and what the watch remembers."""
    import psutil
    import torch.distributed as dist

    from ppkit.transport import rendezvous

    _join(rank, world_size, port)
    listening = sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
                        if c.status == "LISTEN" and c.laddr.port == port})
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return {"listening": listening, "history": rendezvous.history(), "sum": t.item()}


def join_again_and_hang(rank, world_size, port):
    import torch.distributed as dist

    _join(rank, world_size, port)
    if rank == 0:
        dist.recv(torch.zeros(1), src=1)  # rank 1 never sends: the job hangs here


def test_every_worker_wraps_torchs_env_and_tcp_handlers_once(bare):
    def wrapped(rank, world_size):
        from ppkit.transport import rendezvous

        rendezvous.watch()  # a second call must not wrap the wrapper
        handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
        return {s: (getattr(handlers[s], "ppkit_watched", False), "_watched" in handlers[s].__qualname__)
                for s in ("env", "tcp")}

    assert bare.run(wrapped) == [{"env": (True, True), "tcp": (True, True)}] * 2


def test_the_store_a_rank_hosts_listens_on_loopback_and_the_rendezvous_is_remembered(bare):
    port = free_port()
    results = bare.run(join_and_leave, port)
    assert results[0]["listening"] == ["127.0.0.1"]  # torch alone would listen on every interface
    assert results[1]["listening"] == []
    assert [r["sum"] for r in results] == [2.0, 2.0]
    assert all(Rendezvous("env", "localhost", port) in r["history"] for r in results)


@pytest.mark.slow
def test_a_hang_after_a_group_was_recreated_on_the_same_port_names_it(bare):
    if bare.state == "broken":
        bare.restart()
    port = free_port()
    bare.run(join_and_leave, port)
    with pytest.raises(ppkit.JobTimeoutError) as info:
        bare.run(join_again_and_hang, port, timeout=8)
    message = str(info.value)
    assert f"created a process group on port {port} (env://localhost:{port}) 2 times in the same process" in message
    assert "PyTorch issue 74666" in message
    assert "ppkit.spawn(fn, args=(world_size,), nprocs=world_size)" in message and "new MASTER_PORT" in message
    assert "Usually a send without a matching recv" not in message
    assert info.value.rendezvous[0].count(Rendezvous("env", "localhost", port)) == 2
    assert "dist.recv(torch.zeros(1), src=1)" in info.value.stacks[0]
    bare.restart()


def test_a_hang_without_a_recreated_group_keeps_the_usual_advice():
    message = str(diagnostics.job_timed_out(5, [0], [1], {0: "stack"}, {0: (Rendezvous("env", "localhost", 1),)}))
    assert "Usually a send without a matching recv" in message and "74666" not in message


def test_repeated_rendezvous_finds_the_port_most_ranks_reused():
    env, tcp = Rendezvous("env", "localhost", 1), Rendezvous("tcp", "127.0.0.1", 2)
    histories = {0: (env,) * 3 + (tcp,) * 2, 1: (tcp,) * 2, 2: (Rendezvous("env", "localhost", 9),)}
    assert diagnostics.repeated_rendezvous(histories) == ([0, 1], tcp, 2)
    assert diagnostics.repeated_rendezvous({0: (Rendezvous("env", "h", 1), Rendezvous("env", "h", 2))}) is None
    assert diagnostics.reinit_note({}) == ""
