"""Run torchft replica groups as real processes, kill one with SIGKILL at a chosen step, bring it back.

    run = run_replicas(3, steps=30, kill=Kill(replica=2, at_step=8, back_after=6))
    run.quorum_sizes()        # {1: 3, ..., 8: 3, 9: 2, ...}: the others went on without it
    run.recovered, run.recovery_seconds, run.steps_missed(), run.weights_equal

Every replica group is one process (``replica.py``) in a session of its own; whatever way the run ends, every
one of them, and the lighthouse this call started, is stopped with its whole process group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ppkit.errors import ConfigError, JobTimeoutError, LaunchError, WorkerDiedError
from ppkit.lessons.fault_tolerance._process_group import child_env, stop_group
from ppkit.lessons.fault_tolerance.lighthouse import Lighthouse, require_torchft
from ppkit.lessons.fault_tolerance.run_result import Kill, TorchftRun
from ppkit.transport.procs import in_lasting_thread

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("ddp", "localsgd")


def run_replicas(num_replicas: int = 3, steps: int = 30, *, mode: str = "ddp", sync_every: int = 4,
                 kill: Kill | None = None, step_seconds: float = 0.1, lighthouse: Lighthouse | None = None,
                 heartbeat_timeout_ms: int = 1_500, timeout_s: float = 180.0) -> TorchftRun:
    """Train ``num_replicas`` replica groups of one process each with torchft on gloo for ``steps`` steps.

    ``mode``: "ddp" (torchft's DistributedDataParallel: gradients all-reduced every step) or "localsgd"
    (torchft's LocalSGD: weights averaged every ``sync_every`` steps). ``kill``: a ``Kill`` (DDP only).
    ``step_seconds``: the least time a step takes (the model is tiny; without it the run is over before a
    kill lands). ``lighthouse``: a running ``Lighthouse`` to use, else one is started for this run and
    stopped at its end. Raises WorkerDiedError when a replica dies unasked, JobTimeoutError after
    ``timeout_s``, LaunchError when torchft is missing or the replicas do not start.
    """
    _validate(num_replicas, steps, mode, sync_every, kill, step_seconds)
    require_torchft()
    own_lighthouse = lighthouse is None
    lighthouse = lighthouse or Lighthouse(heartbeat_timeout_ms=heartbeat_timeout_ms)
    folder = tempfile.mkdtemp(prefix="ppkit-torchft-")
    run = _Run(folder, num_replicas, steps, mode, sync_every, step_seconds, timeout_s)
    try:
        lighthouse.start()
        run.lighthouse = lighthouse
        return run.go(kill)
    finally:
        run.stop_all()
        if own_lighthouse:
            lighthouse.stop()
        if not os.environ.get("PPKIT_TORCHFT_KEEP"):  # the replicas' logs, for debugging ppkit itself
            shutil.rmtree(folder, ignore_errors=True)


def _validate(num_replicas, steps, mode, sync_every, kill, step_seconds) -> None:
    if not isinstance(num_replicas, int) or not 1 <= num_replicas <= 8:
        raise ConfigError(f"num_replicas={num_replicas!r}: give 1 to 8 replica groups (each is a process).")
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r}: give a whole number of steps, at least 1.")
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r}: it is one of {MODES}.")
    if not isinstance(sync_every, int) or sync_every < 1:
        raise ConfigError(f"sync_every={sync_every!r}: LocalSGD averages every sync_every >= 1 steps.")
    if step_seconds < 0:
        raise ConfigError(f"step_seconds={step_seconds!r} is negative.")
    if kill is None:
        return
    if mode != "ddp":
        raise ConfigError(f"kill= is for mode='ddp' (this run is {mode!r}): LocalSGD's recovery is not measured here.")
    if not 0 <= kill.replica < num_replicas:
        raise ConfigError(f"Kill(replica={kill.replica}): the replica groups are 0..{num_replicas - 1}.")
    if num_replicas < 2:
        raise ConfigError("a kill needs at least 2 replica groups: the others go on without the one killed.")
    back = kill.back_after or 0
    if not 1 <= kill.at_step or kill.at_step + back >= steps:
        raise ConfigError(f"Kill(at_step={kill.at_step}, back_after={kill.back_after}) with steps={steps}: the "
                          f"kill, and the return, must come before the last step, so that the others still train "
                          f"when it comes back; give at least steps={kill.at_step + back + 8}.")
    if kill.back_after is not None and kill.back_after < 1:
        raise ConfigError(f"Kill(back_after={kill.back_after}): give the steps the others make before it returns "
                          f"(>= 1), or None for a replica that stays dead.")


class _Run:
    def __init__(self, folder, num_replicas, steps, mode, sync_every, step_seconds, timeout_s):
        self.folder, self.num_replicas, self.steps, self.mode = folder, num_replicas, steps, mode
        self.sync_every, self.step_seconds, self.timeout_s = sync_every, step_seconds, timeout_s
        self.lighthouse: Lighthouse | None = None
        self.processes: dict[tuple[int, int], subprocess.Popen] = {}  # (replica, incarnation) -> process
        self.killed: set[tuple[int, int]] = set()
        self.t0 = time.time()

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def start(self, replica: int, incarnation: int, join_path: str | None, hold_in_step: int | None = None) -> None:
        label = f"{replica}.{incarnation}"
        config = dict(replica=replica, incarnation=incarnation, steps=self.steps, mode=self.mode,
                      sync_every=self.sync_every, step_seconds=self.step_seconds, timeout_s=30,
                      lighthouse=self.lighthouse.address, records_path=self.path(f"records-{label}.jsonl"),
                      go_path=self.path("go"), join_path=join_path, hold_in_step=hold_in_step)
        command = [sys.executable, os.path.join(HERE, "replica.py"), json.dumps(config)]
        with open(self.path(f"log-{label}.txt"), "ab") as log:
            self.processes[replica, incarnation] = in_lasting_thread(lambda: subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=child_env()))

    def records(self, replica: int, incarnation: int) -> list[dict]:
        try:
            with open(self.path(f"records-{replica}.{incarnation}.jsonl")) as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def log_tail(self, replica: int, incarnation: int, chars: int = 1500) -> str:
        try:
            with open(self.path(f"log-{replica}.{incarnation}.txt"), errors="replace") as f:
                return f.read()[-chars:]
        except FileNotFoundError:
            return ""

    def go(self, kill: Kill | None) -> TorchftRun:
        for replica in range(self.num_replicas):
            hold = kill.at_step + 1 if kill is not None and kill.mid_step and replica == kill.replica else None
            self.start(replica, 0, None, hold_in_step=hold)
        returning = kill is not None and kill.back_after is not None
        if returning:  # started now, so that its return does not wait for torch's import
            self.start(kill.replica, 1, self.path("join"))
        deadline = time.monotonic() + self.timeout_s
        while not all(any(r["event"] == "joined" for r in self.records(i, 0)) for i in range(self.num_replicas)):
            self.check_exits(deadline, starting=True)
            time.sleep(0.02)
        open(self.path("go"), "w").close()
        self.t0 = time.time()
        result = dict(killed_after_step=None, kill_time=None, return_time=None)
        while any(p.poll() is None for p in self.processes.values()):
            self.check_exits(deadline)
            if kill is not None and result["kill_time"] is None:
                records = self.records(kill.replica, 0)
                steps = [r["step"] for r in records if r["event"] == "step" and r["committed"]]
                if (any(r["event"] == "holding" for r in records) if kill.mid_step
                        else steps and steps[-1] >= kill.at_step):
                    self.sigkill(kill.replica, 0)
                    result["killed_after_step"], result["kill_time"] = steps[-1], time.time() - self.t0
            if returning and result["kill_time"] is not None and result["return_time"] is None:
                others = [r["step"] for i in range(self.num_replicas) if i != kill.replica
                          for r in self.records(i, 0) if r["event"] == "step"]
                if others and max(others) >= result["killed_after_step"] + kill.back_after:
                    open(self.path("join"), "w").close()
                    result["return_time"] = time.time() - self.t0
            time.sleep(0.01)
        self.check_exits(deadline)
        return self.result(kill, **result)

    def sigkill(self, replica: int, incarnation: int) -> None:
        process = self.processes[replica, incarnation]
        self.killed.add((replica, incarnation))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def check_exits(self, deadline: float, starting: bool = False) -> None:
        if not self.lighthouse.running:  # the replicas would wait for a quorum until their timeout (30 s)
            steps = {i: [r.get("step") for r in self.records(i, 0) if r["event"] == "step"][-1:]
                     for i in range(self.num_replicas)}
            raise WorkerDiedError(
                f"torchft's lighthouse ({self.lighthouse.address}) died during the run: it "
                f"{_how(self.lighthouse.returncode)} (last steps: {steps}). "
                f"With no lighthouse no quorum forms, and every replica would wait for one until its timeout, so "
                f"the run was stopped. The lighthouse holds no training state: start a new one (Lighthouse()) "
                f"and run again; its log: {self.lighthouse.log_tail(400).strip() or 'empty'}", ranks=[])
        for (replica, incarnation), process in self.processes.items():
            code = process.poll()
            if code not in (None, 0) and (replica, incarnation) not in self.killed:
                how = _how(code)
                what = "while starting (importing torch/torchft, joining the lighthouse)" if starting else \
                    "while training"
                raise WorkerDiedError(
                    f"torchft replica group {replica}{' (come back)' if incarnation else ''} {how} {what}, "
                    f"and nobody killed it on purpose. Its output ends with:\n{self.log_tail(replica, incarnation)}",
                    ranks=[replica], status=code, how=how)
        if time.monotonic() > deadline:
            steps = {i: [r.get("step") for r in self.records(i, 0) if r["event"] == "step"][-1:]
                     for i in range(self.num_replicas)}
            tails = "\n".join(f"--- replica {i}.{n}:\n{self.log_tail(i, n, 600)}" for i, n in self.processes)
            kind = LaunchError if starting else None
            message = (f"the torchft run did not finish within {self.timeout_s:.0f} s (last steps: {steps}); "
                       f"{'the replicas did not all join' if starting else 'a replica waits'}. A busy machine "
                       f"starts torch slowly: give timeout_s more, or fewer replicas. Their output:\n{tails}")
            if kind is LaunchError:
                raise LaunchError(message)
            raise JobTimeoutError(message, ranks=list(range(self.num_replicas)), stacks={})

    def result(self, kill, killed_after_step, kill_time, return_time) -> TorchftRun:
        records, done, events = [], {}, []
        for (replica, incarnation) in sorted(self.processes):
            for record in self.records(replica, incarnation):
                record["incarnation"] = incarnation
                record["t"] -= self.t0
                if record["event"] == "step":
                    records.append(record)
                elif record["event"] == "done":
                    done[replica] = record
                if record["event"] != "step":
                    events.append(record)
        records.sort(key=lambda r: r["t"])
        return TorchftRun(mode=self.mode, num_replicas=self.num_replicas, steps=self.steps,
                          sync_every=self.sync_every if self.mode == "localsgd" else None, kill=kill,
                          records=records, done=done, killed_after_step=killed_after_step, kill_time=kill_time,
                          return_time=return_time, events=sorted(events, key=lambda r: r["t"]))

    def stop_all(self) -> None:
        for process in self.processes.values():
            stop_group(process, grace=1.0)


def _how(code: int | None) -> str:
    if code is None:
        return "is gone"
    return f"was killed by signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
