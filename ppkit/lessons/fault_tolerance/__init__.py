"""Lesson 15's fault tolerance with torchft: its lighthouse as a process, replica groups of fault-tolerant DDP
or LocalSGD on gloo, one killed with SIGKILL and brought back, and what that costs, measured.

    lighthouse          torchft's lighthouse, started on 127.0.0.1 and stopped (Lighthouse)
    replicas            run_replicas: the replica processes, the kill, the return
    replica             one replica group's process (run by path): Manager, DDP or LocalSGD, a record per step
    run_result          TorchftRun: the records read (quorum per step, steps missed, recovery, weights equal)
"""

from ppkit.lessons.fault_tolerance.lighthouse import Lighthouse, require_torchft
from ppkit.lessons.fault_tolerance.replicas import run_replicas
from ppkit.lessons.fault_tolerance.run_result import Kill, TorchftRun

__all__ = ["Kill", "Lighthouse", "TorchftRun", "require_torchft", "run_replicas"]
