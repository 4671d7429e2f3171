"""The SLURM launcher: every rank is a task of a SLURM job, joining the notebook as a remote agent.

``ppkit.start(4, launcher="slurm", nodes=2)`` from a login node (no allocation) submits one batch
job with ``sbatch`` whose 4 tasks run ``ppkit worker`` and connect back over the authenticated
channel that remote workers use (remote.py); rank = SLURM_PROCID, and each rank sees the SLURM_*
variables srun would give that task on its node (layout.task_env). Inside an allocation
(``SLURM_JOB_ID`` set: salloc, Open OnDemand) it submits nothing: the tasks are a step of that
allocation (``srun --overlap``), over all of its nodes and spread as ``srun -n4`` would spread them.
Every restart and close cancels what it started (scancel), and a reaper process cancels it if the
kernel dies without closing (ppkit/cluster/slurm/reaper.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace

from ppkit.cluster.inbox import Item, LaunchFailed
from ppkit.cluster.launchers.base import Process, child_env
from ppkit.cluster.launchers.remote import RemoteLauncher
from ppkit.cluster.slurm import commands, hosts, layout, script
from ppkit.cluster.slurm.watch import JobUpdate, JobWatch, PendingView, describe
from ppkit.errors import ConfigError, LaunchError
from ppkit.transport import channel, procs
from ppkit.transport.messages import AgentHello, AgentInfo, JoinConfig, Shutdown


class SlurmLauncher(RemoteLauncher):
    name = "slurm"

    def __init__(self, spec, inbox, key: bytes):
        self.options = spec.slurm
        self.allocation = commands.inside_allocation()
        super().__init__(spec, inbox, key)
        self._layout = self._first_layout()  # SLURM's own, once a batch job runs
        self.lay_out({name: tuple(layout.node_ranks(self._layout, i)) for i, name in enumerate(self.names)})
        self._said: dict[int, tuple[int, ...]] = {}  # this job's ranks by node, as each node's agent said them
        self._placed = threading.Condition(self._lock)  # an agent said its ranks, or the job ended
        self._jobs = 0  # jobs ended so far: a rank waiting on an ended job's agents stops waiting
        self.job_id: str | None = None  # this generation's job (inside an allocation: the allocation's)
        self.slurm_script = ""  # what was submitted, or the srun command inside an allocation
        self._srun: subprocess.Popen | None = None
        self._reaper: subprocess.Popen | None = None
        self._watch: JobWatch | None = None
        self._view: PendingView | None = None
        self._last: JobUpdate | None = None
        self._master_addr: str | None = None

    def _first_layout(self) -> str:
        if self.options.ntasks_per_node:  # as many on each node (a batch job asks SLURM for it too)
            return layout.even(self.world_size, self.options.nodes)
        cpus = os.environ.get("SLURM_JOB_CPUS_PER_NODE", "")
        if self.allocation and cpus:  # as srun -n would deal them over the allocation's CPUs
            try:
                return layout.like_srun(self.world_size, layout.tasks_per_node(cpus)[:self.options.nodes])
            except ConfigError:
                pass  # a form SLURM does not write: spread them evenly instead
        return layout.even(self.world_size, self.options.nodes)

    # -- where, and who -----------------------------------------------------------------------
    def listen_address(self) -> tuple[str, int]:
        return self.spec.listen or (hosts.listen_host(), 0)

    def worker_names(self) -> list[str]:
        return [f"node{i}" for i in range(self.options.nodes)]  # `ppkit worker --name node{rank}`, one a node

    def accept(self, conn, first) -> bool:
        """A node's agent says which of the job's ranks SLURM placed on it (layout.py): node{i} is the agent
        whose SLURM_NODEID is i, and what it says stands over any guess (layout.settle)."""
        ranks = tuple(first.info.ranks) if isinstance(first, AgentHello) else ()
        name = first.info.name if isinstance(first, AgentHello) else None
        if name in self.ranks_of:
            usable = bool(ranks) and ranks == tuple(range(ranks[0], ranks[-1] + 1)) \
                and 0 <= ranks[0] <= ranks[-1] < self.world_size  # a run of ranks, as block order gives
            with self._placed:
                self._said[self.names.index(name)] = ranks if usable else ()  # (): it said nothing of use
                said = {node: held for node, held in self._said.items() if held}
                placed = layout.settle(self.world_size, [self.ranks_of[n] for n in self.names], said)
                self.lay_out(dict(zip(self.names, placed)))
                self._placed.notify_all()
        return super().accept(conn, first)

    def init_config(self, rank: int, config: JoinConfig, generation: int) -> JoinConfig:
        # the nodes see this file system too: they keep the kernel's directory and sys.path
        config = replace(super().init_config(rank, config, generation), cwd=config.cwd, sys_path=config.sys_path)
        if self._master_addr is None and self._last is not None and self._last.status is not None:
            self._master_addr = hosts.master_addr(self._last.status.nodes)
        task = layout.task_env(self._tasks_per_node(), rank)  # what srun would have given this task
        if self._master_addr:  # as under srun: the allocation's first node
            task["MASTER_ADDR"] = self._master_addr
        return replace(config, env={**config.env, **task})

    def _tasks_per_node(self) -> list[int]:
        """How many ranks each node holds, once every node's agent has said (they join within moments of each
        other, in one srun step): a rank's SLURM_TASKS_PER_NODE and SLURM_GTIDS need every node's count, and a
        batch job's layout is SLURM's, known to its nodes only. After start_timeout: the best guess so far."""
        with self._placed:
            jobs = self._jobs
            self._placed.wait_for(lambda: len(self._said) == len(self.names) or self._jobs != jobs,
                                  timeout=self.spec.start_timeout)
            return [len(self.ranks_of[name]) for name in self.names]

    # -- a job per generation -----------------------------------------------------------------
    def request(self, missing: list[str], say=print) -> None:
        if not missing or self.job_id is not None:
            return
        command = script.worker_command(f"{self.host}:{self.port}", self.spec.start_timeout)
        env = {k: v for k, v in child_env((self.host, self.port), self.key).items() if k != "PPKIT_PARENT"}
        env[layout.TASKS_ENV] = self._layout  # inside an allocation; a batch job exports SLURM's own
        submitted = time.monotonic()
        if self.allocation:
            self._start_step(command, env)
        else:
            script.OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
            self.slurm_script = script.batch_script(self.options, self.world_size, command,
                                                    str(script.OUTPUT_DIR / "ppkit-%j.out"))
            self.job_id = commands.submit(self.slurm_script, [], env)
        self._reaper = subprocess.Popen(
            [sys.executable, "-m", "ppkit.cluster.slurm.reaper", str(os.getpid()), self.job_id,
             *([str(self._srun.pid)] if self._srun is not None else [])],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env=env)
        nodes, tasks = self.options.nodes, self.world_size
        what = f"a step of your allocation {self.job_id}" if self.allocation else "submitted"
        self._view = PendingView(self.job_id, f"SLURM job {self.job_id}: {what} ({nodes} node{'s' * (nodes > 1)}, "
                                              f"{tasks} task{'s' * (tasks > 1)})")
        self._watch = JobWatch(self.job_id.split(".")[0], self.inbox, submitted)

    def _start_step(self, command: list[str], env: dict) -> None:
        self.slurm_script = " ".join(script.srun_command(self.options, self.world_size, self.allocation, command))
        with open(self.step_log, "wb") as log:
            self._srun = subprocess.Popen(script.srun_command(self.options, self.world_size, self.allocation, command),
                                          env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        self.job_id = self.allocation  # ending srun ends the step (close, restart, and the reaper's way)

    @property
    def step_log(self):
        return self.tmpdir / "srun.log"

    def note(self, item: Item) -> bool:
        if not isinstance(item.msg, JobUpdate):
            return super().note(item)
        if item.msg.job_id != (self.job_id or "").split(".")[0]:
            return True  # an earlier generation's job
        self._last = item.msg
        if self._view is not None and not self.allocation:  # an allocation runs already: nothing to wait for
            self._view.show(describe(item.msg))
        return self.lost(item) is None

    def lost(self, item: Item) -> LaunchFailed | None:
        if not isinstance(item.msg, JobUpdate):
            return super().lost(item)
        status = item.msg.status
        if self._srun is not None and self._srun.poll() is not None and len(self._joined()) < len(self.names):
            return LaunchFailed(None, f"srun exited with code {self._srun.returncode} before every node joined: "
                                      f"{self._step_tail()}\nThe command was: {self.slurm_script}")
        if status is not None and status.hopeless:
            commands.cancel(status.job_id)
            return LaunchFailed(None, (
                f"SLURM job {status.job_id} can never start: squeue's reason is {status.reason}, which waiting does "
                f"not cure (it asks what partition {self.options.partition or '(default)'}, the account or the nodes "
                f"do not allow: nodes={self.options.nodes}, time={self.options.time!r}). It was cancelled. "
                "`sinfo -s` shows each partition's limits."))
        if self.allocation:
            return None  # the allocation is the notebook's own: it runs as long as we do
        if status is None or status.ended:
            return LaunchFailed(None, (
                f"SLURM job {item.msg.job_id} ended ({'unknown to squeue' if status is None else status.state}"
                f"{', reason ' + status.reason if status is not None and status.reason != 'None' else ''}) while "
                f"the cluster used it. {self._output_tail(item.msg.job_id)}Run cluster.restart() for a new job."))
        return None

    def _output_tail(self, job_id: str) -> str:
        try:
            text = (script.OUTPUT_DIR / f"ppkit-{job_id}.out").read_text(errors="replace")[-1500:]
        except OSError:
            return ""
        return f"The job's output ({script.OUTPUT_DIR}/ppkit-{job_id}.out) ends with:\n{text}\n"

    def _step_tail(self) -> str:
        try:
            return self.step_log.read_text(errors="replace")[-1500:] or "(no output)"
        except OSError:
            return "(no output)"

    def stop(self, workers: dict[int, dict]) -> None:
        super().stop(workers)
        self._end_job()

    def _end_job(self) -> None:
        """Cancel this generation's job (or step) and forget its agents; the next begin() starts another."""
        with self._lock:
            agents = list(self.agents.values())
            self.agents.clear()  # before they hang up: gone on purpose, not lost
        for agent in agents:
            self._send(agent.conn, Shutdown("the notebook ended the SLURM job"))
            channel.wake_reader(agent.conn)
        if self._watch is not None:
            self._watch.stop()
        if self._srun is not None:
            procs.stop_processes([self._srun], grace=5.0)
        elif self.job_id is not None:
            commands.cancel(self.job_id)
        if self._reaper is not None and self._reaper.poll() is None:
            self._reaper.terminate()
            self._reaper.wait()
        if self._view is not None:
            self._view.close()
        self.job_id, self._srun, self._watch, self._view, self._last = None, None, None, None, None
        self._master_addr = None
        with self._placed:  # the next job's nodes say their ranks afresh (its layout may differ)
            self._said.clear()
            self._jobs += 1
            self._placed.notify_all()

    def close(self) -> None:
        self._end_job()
        super().close()

    # -- words --------------------------------------------------------------------------------
    def processes(self) -> list[Process]:
        job = [Process("slurm job", self._srun.pid if self._srun else None, where=f"job {self.job_id}")
               ] if self.job_id else []
        return job + super().processes()

    def script(self) -> str:
        return self.slurm_script

    def describe(self) -> str:
        if self.job_id is None:
            return "slurm"
        state = self._last.status if self._last is not None else None
        return f"slurm job {self.job_id}" + (f" {state.state} on {state.nodes}" if state and state.nodes else "")

    def rank_label(self, rank: int, info: dict) -> str:
        """As remote.py's, with what SLURM says of the job now (a lost node shows as NODE_FAIL)."""
        return f"{super().rank_label(rank, info)}{self._job_now()}"

    def agent_lost(self, name: str, info: AgentInfo, silent: float | None) -> str:
        how = "went away" if silent is None else f"said nothing for {silent:g} s"
        return (f"{name} (ranks {list(self.ranks_of[name])}) on {info.host} {how}: its SLURM task ended or its "
                f"node failed{self._job_now()}. cluster.restart() submits a new job.")

    def _job_now(self) -> str:
        try:
            status = commands.status(self.job_id.split(".")[0]) if self.job_id else None
        except (OSError, LaunchError):
            status = None
        if status is None:
            return ""
        reason = f", {status.reason}" if status.reason not in ("", "None") else ""
        return f" (SLURM job {status.job_id} is {status.state}{reason}: `scontrol show job {status.job_id}`)"

    def describe_missing(self, ready: set[int]) -> str:
        if self._last is not None and self._last.status is not None and self._last.status.state == "PENDING":
            return (f"SLURM job {self.job_id} to start (still PENDING, squeue's reason: {self._last.status.reason}; "
                    f"waited {self._last.waited:.0f} s). It was cancelled")
        return super().describe_missing(ready)

    def timeout_hint(self, ready: set[int]) -> str:
        if self._last is not None and self._last.status is not None and self._last.status.state == "PENDING":
            return (f"SLURM has not started it yet (`squeue -j {self.job_id}` says why, `sinfo` shows what is free): "
                    "ask for fewer nodes= or another partition=, or raise start_timeout to wait longer.")
        tail = self._step_tail() if self._srun is not None else self._output_tail(self.job_id or "")
        return (f"The job's tasks did not all join the notebook at {self.host}:{self.port}: the compute nodes must "
                f"reach that address (pass listen='ADDR:0' with an address they reach). {tail}")
