"""torchrun across two simulated hosts: ``--nnodes 2``, one process per node, each node started in
its own namespace, as a learner would start it on two machines."""

from __future__ import annotations

import json

import netns
import pytest
from netns import PY, host_env

pytest.importorskip("ppkit.cluster.tools.env", reason="read_launch_env comes from the lessons branch")
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # slow: make test-fast leaves it out
two_hosts = netns.two_hosts  # the fixture


def torchrun(hosts, node_rank: int) -> list[str]:
    return [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            "--node-rank", str(node_rank), "--master-addr", hosts.master.address,
            "--master-port", "29500", "-m", "ppkit.cluster.tools.allreduce_check"]


def test_torchrun_two_nodes_all_reduce(two_hosts, no_leftovers):
    # Both hostnames resolve to 127.0.1.1 here, so gloo must be told the interface (doctor says so).
    env = host_env("", GLOO_SOCKET_IFNAME="eth0", TP_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
    node0, node1 = two_hosts.run_both(torchrun(two_hosts, 0), torchrun(two_hosts, 1), env=env,
                                      timeout=180)
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, node1.stdout[-3000:]
    rows = [json.loads(line) for line in (node0.stdout + node1.stdout).splitlines() if line.startswith("{")]
    rows.sort(key=lambda r: r["rank"])
    assert [(r["rank"], r["host"], r["sum"]) for r in rows] == [(0, "hosta", 3.0), (1, "hostb", 3.0)]
    assert all(r["world_size"] == 2 and r["local_rank"] == 0 and r["source"] == "torchrun" and
               r["master"] == "198.51.100.1:29500" for r in rows)
