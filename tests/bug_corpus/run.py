"""Run one corpus program through one of ppkit's entry points, and keep what the tools answered.

The doctor speaks in three places: when the hang watch looks, when a run times out or fails (both inside the
job, in this process), and on demand (``ppkit.collective_doctor(cluster)``). The first two are kept by wrapping
``hang_doctor.diagnose`` (what the job computed) and ``HangWatch.look`` (whether the watch showed it) for the
run's length: only answers that reached the learner are graded. An error that carries its diagnosis
(``error.diagnosis``) is taken from there as well.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch.distributed as dist

import ppkit
from ppkit.cluster import hang_doctor
from ppkit.cluster.hang_watch import HangWatch
from ppkit.lessons.data_parallel import free_port


@dataclass
class Shown:
    """One answer of the doctor that the learner saw: ``where`` "watch", "run" (timeout or failure) or
    "on demand"; ``diagnosis`` the tool's structured result."""
    where: str
    diagnosis: object


@dataclass
class Outcome:
    entry: str
    error: BaseException | None = None
    shown: list[Shown] = field(default_factory=list)
    result: object = None


@contextlib.contextmanager
def watching():
    """Collect the doctor's answers computed in this process while the block runs."""
    produced: list[list] = []  # [diagnosis, shown?]
    diagnose, look = hang_doctor.diagnose, HangWatch.look

    def kept_diagnose(*args, **kwargs):
        diagnosis = diagnose(*args, **kwargs)
        produced.append([diagnosis, None])
        return diagnosis

    def kept_look(self, *args, **kwargs):
        message = look(self, *args, **kwargs)
        if produced and produced[-1][1] is None:
            produced[-1][1] = "watch" if message else "hidden"
        return message

    hang_doctor.diagnose, HangWatch.look = kept_diagnose, kept_look
    try:
        yield produced
    finally:
        hang_doctor.diagnose, HangWatch.look = diagnose, look


def _shown(produced, error) -> list[Shown]:
    shown = [Shown(where or "run", d) for d, where in produced if where != "hidden"]
    carried = getattr(error, "diagnosis", None)
    if carried is not None and all(s.diagnosis is not carried for s in shown):
        shown.append(Shown("run", carried))
    return shown


def _spawned(i, fn, world_size, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=world_size)
    fn(i, world_size)
    dist.destroy_process_group()


def _torchrun_main(fn):
    dist.init_process_group("gloo")
    fn(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()


def via_spawn(program) -> Outcome:
    outcome = Outcome("spawn")
    with watching() as produced:
        try:
            ppkit.spawn(_spawned, args=(program.fn, program.world_size, free_port()), nprocs=program.world_size,
                        timeout=program.timeout)
        except (ppkit.WorkerError, ppkit.PPKitError) as exc:
            outcome.error = exc
    outcome.shown = _shown(produced, outcome.error)
    return outcome


def via_torchrun(program) -> Outcome:
    outcome = Outcome("torchrun")
    with watching() as produced:
        try:
            ppkit.torchrun(_torchrun_main, args=(program.fn,), nproc_per_node=program.world_size,
                           timeout=program.timeout)
        except (ppkit.WorkerError, ppkit.PPKitError) as exc:
            outcome.error = exc
    outcome.shown = _shown(produced, outcome.error)
    return outcome


def _warm(rank, world_size):
    """What DDP, FSDP2 and DTensor import on their first call (torch._dynamo: about 3 s of CPU per rank, far more
    under load), imported before the program's time limit starts, as ppkit.spawn's fork server has it already."""
    import torch._dynamo  # noqa: F401


class Clusters:
    """One ``ppkit.start`` cluster per world size, kept between programs, restarted after a broken run."""

    def __init__(self):
        self._by_size: dict[int, ppkit.Cluster] = {}

    def get(self, world_size: int) -> ppkit.Cluster:
        """A running cluster of ``world_size`` ranks (one at a time: starting another closes ppkit's last one)."""
        cluster = self._by_size.get(world_size)
        if cluster is None or cluster.state == "closed":
            self.close()
            cluster = self._by_size[world_size] = ppkit.start(world_size, timeout=60)
        elif cluster.state == "broken":
            cluster.restart()
        cluster.run(_warm, timeout=120)  # a program's time limit is for its bug, not for torch's first imports
        return cluster

    def close(self):
        for cluster in self._by_size.values():
            if cluster.state != "closed":
                cluster.close()
        self._by_size.clear()


def via_cluster(program, clusters: Clusters, on_demand: bool = True) -> Outcome:
    """``cluster.run`` (its watch and its timeout), then ``ppkit.collective_doctor(cluster)`` while the ranks are
    as the run left them. The cluster gets a clean world afterwards, so that each program starts from seq 0."""
    outcome = Outcome("cluster")
    cluster = clusters.get(program.world_size)
    with watching() as produced:
        try:
            outcome.result = cluster.run(program.fn, timeout=program.timeout)
        except (ppkit.WorkerError, ppkit.PPKitError) as exc:
            outcome.error = exc
    outcome.shown = _shown(produced, outcome.error)
    if on_demand:
        try:
            outcome.shown.append(Shown("on demand", ppkit.collective_doctor(cluster)))
        except ppkit.PPKitError as exc:  # a cluster whose ranks cannot answer: nothing shown on demand
            outcome.shown.append(Shown("on demand", exc))
    cluster.restart()  # every program starts with fresh process groups (sequence numbers from 1)
    return outcome


def hang_seconds() -> str:
    """The hang watch's time for graded runs: short, so that it looks during the programs' long computations."""
    return os.environ.setdefault("PPKIT_HANG_S", "2")
