"""Nothing ppkit starts listens on every interface (0.0.0.0 or ::): not the RPC world's rendezvous
in two-machine mode, nor notebook 03's tcp:// and env:// examples, nor the torchrun example.

torch's TCPStore server listens on every interface whatever host it is given; ppkit hands it a
socket bound to the right address instead (ppkit/cluster/worker_setup.py ``tcp_store``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest
from leftovers import SLURM_DAEMONS

import ppkit
from ppkit.lessons import data_parallel as dp
from ppkit.lessons import rank_variables

pytestmark = pytest.mark.timeout(300)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WILDCARDS = {"0.0.0.0", "::"}


def listening(pids=None) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of ``pids`` (this process and its children)."""
    if pids is None:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
    else:
        procs = [psutil.Process(pid) for pid in pids]
    found = set()
    for proc in procs:
        try:
            if proc.name().startswith(SLURM_DAEMONS):  # the SLURM test cluster's, not ppkit's (tests/slurm_testbed.py)
                continue
            found.update((c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                         if c.status == psutil.CONN_LISTEN)
        except psutil.Error:
            pass
    return found


class Watch:
    """Poll this process tree's listening sockets in a thread while a block runs."""

    def __enter__(self):
        self.seen, self._stop = set(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.seen |= listening()
            time.sleep(0.02)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.seen |= listening()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_demo_seen_listening(rank, world_size, init_method, env):
    """``dp.init_demo``, noting this rank's listening sockets while its process group is up."""
    import psutil
    import torch.distributed as dist

    real, seen = dist.destroy_process_group, []

    def destroy(*args, **kwargs):
        seen.extend((c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN)
        dist.barrier()  # every rank has looked before rank 0's store goes
        return real(*args, **kwargs)

    dist.destroy_process_group = destroy
    try:
        return dp.init_demo(rank, world_size, init_method, env), seen
    finally:
        dist.destroy_process_group = real


def test_notebook_03_tcp_and_env_examples_listen_on_127_0_0_1_only(no_leftovers):
    port = free_port()
    methods = [("env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}),
               (f"tcp://127.0.0.1:{port}", None)]  # the same port twice, as in the notebook
    with ppkit.Cluster(4, "gloo", process_group=False, timeout=60) as bare:
        for method, env in methods:
            results = bare.run(init_demo_seen_listening, method, env)
            assert [r["all_reduce"] for r, _ in results] == [10.0] * 4
            seen = {entry for _, listeners in results for entry in listeners}
            assert ("127.0.0.1", port) in seen, (method, seen)  # rank 0's store, seen while up
            assert {ip for ip, _ in seen} == {"127.0.0.1"}, (method, seen)


def test_loopback_store_only_for_loopback_addresses():
    assert dp.loopback_store("file:///tmp/x", 2, 5) is None
    assert dp.loopback_store("tcp://10.0.0.1:29500", 2, 5) is None  # across machines: torch's way


def test_the_torchrun_example_listens_on_127_0_0_1_only():
    port = free_port()
    with Watch() as watch:
        records = rank_variables.torchrun_env(nnodes=2, nproc_per_node=2, port=port)
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    assert ("127.0.0.1", port) in watch.seen, watch.seen  # node 0's rendezvous store
    assert not {ip for ip, _ in watch.seen} & WILDCARDS, watch.seen


def test_the_rpc_world_across_machines_rendezvous_on_the_listen_address_only(no_leftovers):
    import torch.distributed.rpc as rpc

    port, key = free_port(), os.urandom(32).hex()
    worker = subprocess.Popen([sys.executable, "-m", "ppkit", "worker", "--connect", f"127.0.0.1:{port}",
                               "--name", "worker1"], env={**os.environ, "PPKIT_KEY": key, "PYTHONPATH": REPO},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = listening([os.getpid()])
    try:
        with ppkit.start_rpc(1, listen=f"127.0.0.1:{port}", key=key, start_timeout=90):
            assert rpc.rpc_sync("worker1", os.getpid) != os.getpid()
            opened = listening([os.getpid()]) - before  # the world is up: its stores listen
        worker.wait(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert ("127.0.0.1", port) in opened, opened  # the control channel
    # the process group's store and the RPC rendezvous store (held by this process, its port told
    # to the workers), TensorPipe: on the listen address, none on every interface
    assert len(opened) >= 3 and not {ip for ip, _ in opened} & WILDCARDS, opened
