"""SLURM's own tools, run as a user would (``SLURM_CONF`` and the user's defaults honoured), with
their messages kept inside ppkit's errors."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from ppkit.errors import ConfigError, LaunchError

TOOLS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo")
ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT", "REVOKED")
# squeue reasons for a pending job that waiting will never cure (the job asks what the partition,
# the account or the nodes cannot give); ppkit cancels such a job at once rather than wait
HOPELESS = ("PartitionTimeLimit", "PartitionNodeLimit", "PartitionDown", "PartitionInactive", "BadConstraints",
            "InvalidAccount", "InvalidQOS", "ReqNodeNotAvail", "NodeDown", "AssocGrpNodeLimit",
            "AssocMaxNodesPerJobLimit", "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit",
            "AssocMaxWallDurationPerJobLimit", "JobHeldAdmin", "DependencyNeverSatisfied")


@dataclass(frozen=True)
class JobStatus:
    """One line of squeue about a job: its state, squeue's reason and its nodes."""
    job_id: str
    state: str
    reason: str
    nodes: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def hopeless(self) -> bool:
        return self.state == "PENDING" and self.reason.split(",")[0] in HOPELESS


def missing_tools(tools=TOOLS) -> list[str]:
    return [t for t in tools if shutil.which(t) is None]


def require_tools(tools=TOOLS) -> None:
    """ConfigError naming what to install when SLURM's commands are not on PATH."""
    missing = missing_tools(tools)
    if missing:
        raise ConfigError(
            f"launcher='slurm' needs SLURM's commands, and {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "not on PATH here. On a cluster's login node they usually are (try `module load slurm`); on a "
            "Debian/Ubuntu machine of your own: apt-get install slurm-client (and slurmctld, slurmd, munge "
            "for a cluster of one machine). Without SLURM, use the default launcher (ppkit.start(n)) or "
            "launcher='remote' for machines you start by hand.")


def run(args: list[str], *, input: str | None = None, env: dict | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a SLURM command; LaunchError if it cannot be run or does not answer within ``timeout``."""
    try:
        return subprocess.run(args, input=input, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        require_tools([args[0]])
        raise
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"`{' '.join(args[:3])} ...` did not answer within {timeout:g} s: is slurmctld up? "
                          "`sinfo` and `scontrol ping` tell.") from exc


def said(proc: subprocess.CompletedProcess) -> str:
    """What a SLURM command said, on one line."""
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip() or f"exit status {proc.returncode}"
    return " ".join(text.split())


def submit(script: str, args: list[str], env: dict[str, str]) -> str:
    """``sbatch --parsable ARGS`` with ``script`` on stdin; the job id."""
    proc = run(["sbatch", "--parsable", *args], input=script, env=env)
    if proc.returncode != 0:
        raise LaunchError(
            f"sbatch refused the job: {said(proc)}. Nothing was queued. Check the partition, node count and "
            "time limit against `sinfo -s` (and `sacctmgr show assoc user=$USER` for accounts), then start "
            "again with other nodes=, partition= or time=.")
    return proc.stdout.strip().split(";")[0]


def status(job_id: str) -> JobStatus | None:
    """The job as squeue sees it, or None once SLURM has forgotten it."""
    proc = run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%T|%r|%N"], timeout=15)
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0] == job_id:
            return JobStatus(*parts)
    return None


def cancel(job_id: str) -> None:
    """``scancel``; quiet, as it must work while the notebook closes (a gone job is fine)."""
    try:
        run(["scancel", job_id], timeout=15)
    except (LaunchError, OSError):
        pass


def hostnames(nodelist: str) -> list[str]:
    """``scontrol show hostnames``: n[1-2] -> n1, n2, as SLURM's own tools expand it."""
    proc = run(["scontrol", "show", "hostnames", nodelist], timeout=15)
    if proc.returncode != 0:
        raise LaunchError(f"scontrol could not expand the node list {nodelist!r}: {said(proc)}")
    return proc.stdout.split()


def node_addr(node: str) -> str | None:
    """The NodeAddr SLURM has for ``node`` (what its daemons use where the name does not resolve)."""
    proc = run(["scontrol", "-o", "show", "node", node], timeout=15)
    for field in proc.stdout.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return None


def inside_allocation(environ=os.environ) -> str | None:
    """The job id of the allocation this process runs in (salloc, a batch job, Open OnDemand)."""
    return environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")


def answers() -> bool:
    """True when ``sinfo`` answers: SLURM's commands are here and a controller replies."""
    if missing_tools(("sinfo",)):
        return False
    try:
        return run(["sinfo", "-h", "-o", "%P"], timeout=10).returncode == 0
    except LaunchError:
        return False
