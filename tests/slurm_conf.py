"""The slurm.conf of the SLURM test cluster (tests/slurm_testbed.py), for SLURM 22.05 (Debian bookworm).

Two nodes on this machine, told apart by port: n1 and n2, NodeAddr=127.0.0.1, CPUs=4 each (more
than a 2-core machine has: SlurmdParameters=config_overrides). Partition ``debug`` (the default,
both nodes, MaxTime one hour) and ``one`` (n1 only), so a test can ask for more nodes, or more time,
than a partition allows; EnforcePartLimits keeps slurm's default (NO): such a job is accepted and
stays PENDING with reason PartitionNodeLimit or PartitionTimeLimit.

Everything else slurm keeps is default too, as a learner's cluster would have it; notably
JobRequeue=1: a batch job whose node fails is requeued (PENDING, reason BeginTime, Restarts=1),
not ended, unless it was submitted with --no-requeue.
"""

from __future__ import annotations

from pathlib import Path

NODES = ("n1", "n2")
CPUS_PER_NODE = 4
PARTITIONS = {"debug": NODES, "one": NODES[:1]}


def render_slurm_conf(directory: Path, ctld_port: int, node_ports: dict[str, int], user: str) -> str:
    """slurm.conf text: state, spool, logs, pid files and the munge socket all under ``directory``."""
    d = directory
    nodes = "\n".join(
        f"NodeName={n} NodeAddr=127.0.0.1 Port={node_ports[n]} CPUs={CPUS_PER_NODE} RealMemory=1024 State=UNKNOWN"
        for n in NODES
    )
    debug, one = (",".join(PARTITIONS[p]) for p in ("debug", "one"))
    return f"""\
# ppkit's SLURM test cluster (tests/slurm_testbed.py): everything below {d}
ClusterName=ppkittest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.sock
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
# no SPANK plugins from /etc/slurm
PlugStackConfig={d}/plugstack.conf
MailProg=/bin/true
# no cgroups (so no cgroup.conf): processes are tracked by parent pid, tasks are not bound
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# start a batch job as soon as it fits (the default may wait 3 s)
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
SwitchType=switch/none
SlurmdParameters=config_overrides
# a killed slurmd: NOT_RESPONDING after ~10 s, DOWN after ~20 s, when its job steps fail (node failure);
# a restarted one is back IDLE as soon as it registers (ReturnToService=2)
SlurmdTimeout=10
MessageTimeout=5
ReturnToService=2
KillWait=2
{nodes}
PartitionName=debug Nodes={debug} Default=YES MaxTime=01:00:00 State=UP
PartitionName=one Nodes={one} MaxTime=01:00:00 State=UP
"""
