"""One torchft replica group of one process, run by path: ``python replica.py CONFIG_JSON``.

It trains a small model with torchft's Manager on torchft's gloo process group, either as fault-tolerant DDP
(gradients all-reduced every step) or as LocalSGD (weights averaged every ``sync_every`` steps), and appends one
JSON line per step to ``records_path``: the loss, the quorum (which replicas, how many take part), the replica's
step. ``replicas.py`` starts it, kills it and reads what it wrote. It imports torch, then waits for
``join_path`` (a replica that comes back is started early, so that its return is not the time torch takes to
import), joins (torchft's Manager), waits for ``go_path`` (all first replicas start together) and trains.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timedelta

try:
    from ._child import die_with_parent
except ImportError:  # run by path, as a script
    from _child import die_with_parent

if __name__ == "__main__":
    die_with_parent()  # before torch's import, which takes seconds on a busy machine

import torch  # noqa: E402
from torch import nn  # noqa: E402


def make_model(seed: int = 0) -> nn.Module:
    """The same small MLP on every replica (one seed): torchft then needs no weight sync at step 0."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def batch(replica: int, step: int, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression batch for (replica, step): each replica sees its own data, the same on every run."""
    g = torch.Generator().manual_seed(1000 * replica + step)
    x = torch.randn(size, 16, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=g)
    return x, y


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _recording_gloo():
    """torchft's ProcessGroupGloo that also remembers the quorum it was configured for and counts the bytes
    handed to all_reduce (the payload; a ring all-reduce puts about twice that on each link)."""
    from torchft.process_group import ProcessGroupGloo

    class RecordingGloo(ProcessGroupGloo):
        quorum_members: list[int] = []
        quorum_id = -1
        allreduce_calls = 0
        allreduce_bytes = 0

        def configure(self, store_addr, replica_id, rank, world_size, quorum_id=None, group_rank=None,
                      group_world_size=None, global_ranks=None):
            self.quorum_members = sorted(global_ranks or [])
            self.quorum_id = quorum_id if quorum_id is not None else -1
            super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank, group_world_size,
                              global_ranks)

        def allreduce(self, tensors, opts):
            self.allreduce_calls += 1
            self.allreduce_bytes += sum(t.numel() * t.element_size() for t in tensors)
            return super().allreduce(tensors, opts)

    return RecordingGloo


def _ddp_class():
    """torchft's DistributedDataParallel with a comm hook that survives a peer dying in the all-reduce.

    torchft 0.2.0 (and its main branch as of 2025-10, 73dafea): when the gloo all-reduce fails (a peer was
    killed), ``_ManagedWork.wait()`` catches the error and reports it to the Manager, so that should_commit
    drops the step, but it never builds the work's future chain; ``DistributedDataParallel._comm_hook`` then
    fails ``assert fut._fut`` and the healthy replica dies too. Here the hook hands DDP the bucket as it is
    instead: the step is dropped all the same, and the replica goes on with the next quorum.
    """
    from torchft import DistributedDataParallel

    class DistributedDataParallelSurvivingPeers(DistributedDataParallel):
        @staticmethod
        def _comm_hook(state, bucket):
            work = state.allreduce(bucket.buffer())
            work.wait()
            fut = work.get_future()._fut
            if fut is None:  # the all-reduce failed and was reported: should_commit() will say no
                fut = torch.futures.Future()
                fut.set_result(bucket.buffer())
            return fut

    return DistributedDataParallelSurvivingPeers


class _Log:
    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)

    def write(self, **record) -> None:
        record["t"] = time.time()
        record["pid"] = os.getpid()
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


def _wait_for(path: str | None) -> None:
    while path is not None and not os.path.exists(path):
        time.sleep(0.01)


def main(config: dict) -> None:
    from torch.distributed import TCPStore
    from torchft import Manager
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.local_sgd import LocalSGD
    from torchft.optim import OptimizerWrapper

    replica, steps, mode = config["replica"], config["steps"], config["mode"]
    log = _Log(config["records_path"])
    log.write(event="started", replica=replica)
    timeout = timedelta(seconds=config["timeout_s"])
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = _recording_gloo()(timeout=timeout)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    _wait_for(config.get("join_path"))  # all above is ready before a replica that comes back joins
    manager = Manager(
        pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
        replica_id=f"replica_{replica}", lighthouse_addr=config["lighthouse"], hostname="127.0.0.1",
        store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1, init_sync=False,
        timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
        checkpoint_transport=PGTransport(pg, timeout=timeout, device=torch.device("cpu")),
    )
    log.write(event="joined", replica=replica)
    _wait_for(config["go_path"])

    loss_fn = nn.MSELoss()
    if mode == "ddp":
        ddp = _ddp_class()(manager, model)
        optimizer = OptimizerWrapper(manager, inner)
        while manager.current_step() < steps:
            started, before = time.monotonic(), manager.current_step()
            optimizer.zero_grad()  # starts the quorum for this step
            x, y = batch(replica, before)
            loss = loss_fn(ddp(x), y)
            if before + 1 == config.get("hold_in_step"):  # to be killed here, the others in the all-reduce
                log.write(event="holding", replica=replica, step=before)
                time.sleep(3600)
            loss.backward()
            optimizer.step()  # steps the optimizer only if every replica group's step went well
            after = manager.current_step()
            log.write(event="step", replica=replica, step=after, step_before=before, committed=after > before,
                      healed=after > before + 1, loss=loss.item(), participants=manager.num_participants(),
                      quorum=pg.quorum_members, quorum_id=pg.quorum_id, allreduce_calls=pg.allreduce_calls,
                      allreduce_bytes=pg.allreduce_bytes)
            time.sleep(max(0.0, config["step_seconds"] - (time.monotonic() - started)))
    elif mode == "localsgd":
        with LocalSGD(manager, model, inner, sync_every=config["sync_every"]):
            for local_step in range(1, steps + 1):
                started, syncs_before = time.monotonic(), manager.current_step()
                inner.zero_grad()
                x, y = batch(replica, local_step)
                loss = loss_fn(model(x), y)
                loss.backward()
                inner.step()  # LocalSGD's hook averages the weights every sync_every steps
                log.write(event="step", replica=replica, step=local_step, syncs=manager.current_step(),
                          synced=manager.current_step() > syncs_before, loss=loss.item(),
                          participants=manager.num_participants(), quorum=pg.quorum_members,
                          quorum_id=pg.quorum_id, allreduce_calls=pg.allreduce_calls,
                          allreduce_bytes=pg.allreduce_bytes)
                time.sleep(max(0.0, config["step_seconds"] - (time.monotonic() - started)))
    else:
        raise ValueError(f"mode must be 'ddp' or 'localsgd', not {mode!r}")
    log.write(event="done", replica=replica, step=manager.current_step(), weights_sha256=weights_sha256(model),
              allreduce_calls=pg.allreduce_calls, allreduce_bytes=pg.allreduce_bytes,
              param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
    manager.shutdown(wait=False)
    sys.stdout.flush()
    os._exit(0)  # torchft's threads (quorum, heartbeats) need not be joined: the run is over


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
