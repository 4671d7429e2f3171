"""How launchers tell a process who it is: real torchrun runs, and what SLURM would set.

``torchrun_env`` starts torchrun on this machine (every socket on 127.0.0.1: ppkit/cluster/tools/torchrun.py)
as if it were ``nnodes`` machines
and returns what ``read_launch_env`` reads in every process it started. ``slurm_env`` writes the
variables that ``srun`` gives a task, for a job you describe, so that the SLURM half of
``read_launch_env`` can be shown without a SLURM cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ppkit.errors import ConfigError, LaunchError


def torchrun_env(nnodes: int = 2, nproc_per_node: int = 2, port: int | None = None,
                 timeout: float = 120) -> list[dict]:
    """Run ``python -m ppkit.cluster.tools.env`` under ``nnodes`` torchrun agents on 127.0.0.1.

    Each agent plays one machine (``--node_rank``); every process prints what it read. Returns
    those records sorted by rank.
    """
    from ppkit.lessons.data_parallel import free_port

    if nnodes < 1 or nproc_per_node < 1:
        raise ConfigError(f"need nnodes >= 1 and nproc_per_node >= 1, got {nnodes} and {nproc_per_node}.")
    port = port or free_port()
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    agents = [
        subprocess.Popen(
            # torchrun itself; ppkit.cluster.tools.torchrun only keeps its store on 127.0.0.1
            [sys.executable, "-m", "ppkit.cluster.tools.torchrun", f"--nnodes={nnodes}",
             f"--node_rank={node}", f"--nproc_per_node={nproc_per_node}", "--master_addr=127.0.0.1",
             f"--master_port={port}", "-m", "ppkit.cluster.tools.env"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in range(nnodes)]
    records, errors = [], []
    try:
        for node, agent in enumerate(agents):
            out, err = agent.communicate(timeout=timeout)
            if agent.returncode != 0:
                errors.append(f"agent for node {node} exited with {agent.returncode}:\n{err[-2000:]}")
            for line in out.splitlines():
                if line.startswith("{"):
                    records.append({**json.loads(line), "node": node})
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"torchrun did not finish within {timeout:g} s; the machine may be overloaded. "
                          "Try again, or fewer processes (nnodes=1).") from exc
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    if errors:
        raise LaunchError("torchrun failed:\n" + "\n".join(errors))
    return sorted(records, key=lambda r: r["rank"])


def slurm_env(procid: int, ntasks: int, ntasks_per_node: int, nodelist: str) -> dict[str, str]:
    """The variables ``srun`` sets for task ``procid`` with the default block distribution
    (tasks fill node 0 first, then node 1, ...)."""
    from ppkit.cluster.tools.env import expand_nodelist

    hosts = expand_nodelist(nodelist)
    if not 0 <= procid < ntasks or ntasks > ntasks_per_node * len(hosts):
        raise ConfigError(f"task {procid} of {ntasks} does not fit {len(hosts)} node(s) x "
                          f"{ntasks_per_node} task(s).")
    node = procid // ntasks_per_node
    return {"SLURM_PROCID": str(procid), "SLURM_NTASKS": str(ntasks),
            "SLURM_LOCALID": str(procid % ntasks_per_node), "SLURM_NODEID": str(node),
            "SLURM_NODELIST": nodelist, "SLURMD_NODENAME": hosts[node]}
