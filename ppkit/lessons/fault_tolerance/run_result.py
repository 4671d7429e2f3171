"""What a torchft run left behind, read: per-step records and the numbers the lesson measures."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Kill:
    """SIGKILL replica group ``replica`` once it has finished step ``at_step``; start it again once the others
    have made ``back_after`` more steps (None: it stays dead). ``mid_step``: kill it in the next step instead,
    after its forward pass, while the others wait for its gradients in the all-reduce."""

    replica: int
    at_step: int
    back_after: int | None = 4
    mid_step: bool = False


@dataclass
class TorchftRun:
    """One run of ``run_replicas``. ``records``: every step of every replica process, in time order, each a dict
    with ``replica``, ``incarnation`` (0, then 1 for a replica that came back), ``step`` (torchft's step after
    this one: the count of committed steps), ``committed``, ``loss``, ``participants`` (replica groups whose
    gradients counted), ``quorum`` (the replica groups in this step's process group), ``t`` (seconds since the
    start), ``allreduce_calls``/``allreduce_bytes`` (so far, this process). ``done``: each replica's last record
    (its final step and the sha256 of its weights)."""

    mode: str
    num_replicas: int
    steps: int
    sync_every: int | None
    kill: Kill | None
    records: list[dict]
    done: dict[int, dict]
    killed_after_step: int | None = None  # the last step the killed replica finished before the SIGKILL
    kill_time: float | None = None
    return_time: float | None = None  # when the replica that came back was let join
    events: list[dict] = field(default_factory=list)  # started, joined, done: per process, in time order

    def of(self, replica: int, incarnation: int | None = None) -> list[dict]:
        return [r for r in self.records if r["replica"] == replica
                and (incarnation is None or r["incarnation"] == incarnation)]

    @property
    def healthy(self) -> list[int]:
        return [i for i in range(self.num_replicas) if self.kill is None or i != self.kill.replica]

    def quorum_sizes(self, replica: int | None = None) -> dict[int, int]:
        """Step -> how many replica groups took part in it, as ``replica`` (the first healthy one) saw it."""
        replica = self.healthy[0] if replica is None else replica
        return {r["step"]: r["participants"] for r in self.of(replica) if r["committed"]}

    def loss_curve(self, replica: int) -> list[tuple[int, float]]:
        """(step, loss) of ``replica``'s steps, over all its lives: its own batch's loss, before the step's
        update; for DDP only the steps that counted (a dropped step is done again)."""
        return [(r["step"], r["loss"]) for r in self.of(replica) if self.mode == "localsgd" or r["committed"]]

    def steps_missed(self) -> dict[int, list[int]]:
        """Replica -> the steps, up to the last, whose gradients it did not give: it was dead, or it was
        recovering (the step it recovered in it took part with zeros, as torchft does)."""
        last = max(self.final_steps().values(), default=0)
        missed = {}
        for replica in range(self.num_replicas):
            own = {r["step"] for r in self.of(replica) if r["committed"] and not r.get("healed")}
            missed[replica] = [s for s in range(1, last + 1) if s not in own]
        return missed

    def final_steps(self) -> dict[int, int]:
        return {replica: record["step"] for replica, record in self.done.items()}

    @property
    def recovered(self) -> bool:
        """Whether the replica that came back took its weights from a peer (torchft's live recovery)."""
        return any(r.get("healed") for r in self.records if r["incarnation"] == 1)

    @property
    def recovery_step(self) -> int | None:
        """The step at which the returning replica had recovered and trained with the others again."""
        healed = [r for r in self.records if r["incarnation"] == 1 and r.get("healed")]
        return healed[0]["step"] if healed else None

    @property
    def recovery_seconds(self) -> float | None:
        """From the moment the replica was let back in (its process already running) to its first step with
        weights taken from a peer: joining the quorum, the transfer and the step."""
        healed = [r for r in self.records if r["incarnation"] == 1 and r.get("healed")]
        if not healed or self.return_time is None:
            return None
        return healed[0]["t"] - self.return_time

    @property
    def join_seconds(self) -> float | None:
        """From the return to the returning replica's Manager being up (store, manager server, lighthouse)."""
        joined = [e["t"] for e in self.events if e["incarnation"] == 1 and e["event"] == "joined"]
        return joined[0] - self.return_time if joined and self.return_time is not None else None

    @property
    def stall_seconds(self) -> float | None:
        """How long the healthy replicas waited after the kill before their next step counted: about the
        lighthouse's heartbeat timeout."""
        if self.kill_time is None:
            return None
        firsts = []
        for replica in self.healthy:
            after = [r["t"] for r in self.of(replica) if r["committed"] and r["t"] > self.kill_time
                     and r["participants"] < self.num_replicas]
            if after:
                firsts.append(after[0])
        return max(firsts) - self.kill_time if firsts else None

    @property
    def weights_equal(self) -> bool:
        """Whether every replica ended with the same weights (sha256 of its state_dict) at the same step."""
        if len(self.done) != self.num_replicas:
            return False
        return (len({d["weights_sha256"] for d in self.done.values()}) == 1
                and len(set(self.final_steps().values())) == 1)

    def syncs(self) -> dict[int, int]:
        """Replica -> how many times its weights or gradients went through an all-reduce that counted."""
        key = "synced" if self.mode == "localsgd" else "committed"
        return {i: sum(1 for r in self.of(i) if r.get(key)) for i in range(self.num_replicas)}

    def allreduce_bytes(self) -> dict[int, int]:
        """Replica -> bytes it handed to all_reduce over the run (the payload; its last process)."""
        return {i: d["allreduce_bytes"] for i, d in self.done.items()}

    def summary(self) -> dict:
        out = {"mode": self.mode, "replicas": self.num_replicas, "steps": self.steps,
               "weights_equal": self.weights_equal, "syncs": self.syncs(), "allreduce_bytes": self.allreduce_bytes()}
        if self.kill is not None:
            out.update(killed_replica=self.kill.replica, killed_after_step=self.killed_after_step,
                       stall_seconds=self.stall_seconds, recovered=self.recovered, recovery_step=self.recovery_step,
                       join_seconds=self.join_seconds, recovery_seconds=self.recovery_seconds,
                       steps_missed=self.steps_missed())
        return out
