"""Addresses on a SLURM cluster: a node's, the allocation's first node's (MASTER_ADDR), and the
one this machine should listen on so that the compute nodes reach the notebook."""

from __future__ import annotations

import ipaddress
import socket

from ppkit.cluster.slurm import commands
from ppkit.errors import LaunchError


def node_address(node: str) -> str:
    """``node``'s IPv4 address: its name if it resolves, else SLURM's NodeAddr for it (as srun does)."""
    try:
        return socket.gethostbyname(node)
    except OSError:
        pass
    addr = commands.node_addr(node)
    if addr:
        try:
            return socket.gethostbyname(addr)
        except OSError:
            pass
    raise LaunchError(f"node {node!r} neither resolves nor has a NodeAddr that does (scontrol show node "
                      f"{node} says NodeAddr={addr}); ask the cluster's admins how its nodes are addressed.")


def master_addr(nodelist: str) -> str:
    """MASTER_ADDR for a job on ``nodelist``: the address of its first node."""
    return node_address(commands.hostnames(nodelist)[0])


def listen_host(node: str | None = None) -> str:
    """Where the notebook's control channel should listen for the workers on ``node`` (a node of the
    default partition when not given): loopback when the nodes are this machine, else the address of
    the interface the route to them leaves by (found with a UDP connect, which sends nothing)."""
    if node is None:
        proc = commands.run(["sinfo", "-h", "-N", "-o", "%N"], timeout=15)
        node = (proc.stdout.split() or [socket.gethostname()])[0]
    target = node_address(node)
    if ipaddress.ip_address(target).is_loopback:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((target, 9))
        return probe.getsockname()[0]


if __name__ == "__main__":  # `python -m ppkit.cluster.slurm.hosts NODELIST` prints MASTER_ADDR (batch scripts)
    import sys

    print(master_addr(sys.argv[1]))
