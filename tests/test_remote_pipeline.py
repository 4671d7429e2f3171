"""Seed 000's layout for real: ResNet50 shard 1 on the master (host A), shard 2 on worker1 (host B),
over two network namespaces, forward and backward, against a local ResNet50 with the same weights."""

from __future__ import annotations

import json
import os

import netns
import pytest
from netns import PY, host_env

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # slow: make test-fast leaves it out
two_hosts = netns.two_hosts  # the fixture

FORWARD_BACKWARD = """
import json, socket, sys
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import ppkit
from ppkit.models.resnet import resnet50, split_resnet50
from ppkit.pipeline.rpc import PipelineModel

x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)).double()
with ppkit.start_rpc(1, listen=sys.argv[1], start_timeout=120, rpc_timeout=120) as world:
    with PipelineModel("master:cpu,worker1:cpu", microbatch_size=2, dtype=torch.float64) as model:
        model.eval()
        with dist_autograd.context() as context_id:
            out = model(x)
            dist_autograd.backward(context_id, [out.square().mean()])
            grads = model.gradients(context_id)
        hosts = [socket.gethostname(), rpc.rpc_sync("worker1", socket.gethostname)]
local = resnet50(0).double().eval()
expected = local(x)
expected.square().mean().backward()
grad_error = max(((g[name] - p.grad).abs().max() / p.grad.abs().max()).item()
                 for shard, g in zip(split_resnet50(local, "layer2"), grads)
                 for name, p in shard.named_parameters())
print(json.dumps({"hosts": hosts, "shape": list(out.shape), "grad_error": grad_error,
                  "out_error": (out - expected).abs().max().item(),
                  "num_grads": [len(g) for g in grads]}))
"""


def test_resnet50_shards_on_two_hosts_forward_and_backward(two_hosts, no_leftovers):
    key = os.urandom(32).hex()
    where = f"{two_hosts.master.address}:29600"
    master, worker = two_hosts.run_both(
        [PY, "-c", FORWARD_BACKWARD, where],
        [PY, "-m", "ppkit", "worker", "--connect", where, "--name", "worker1"],
        env=host_env(key, OMP_NUM_THREADS="1"), timeout=200)
    assert master.returncode == 0, master.stdout + master.stderr[-3000:]
    result = json.loads(master.stdout.strip().splitlines()[-1])
    assert result["hosts"] == ["hosta", "hostb"]  # shard 2 really ran on the other host
    assert result["shape"] == [4, 1000]
    assert result["out_error"] < 1e-10 and result["grad_error"] < 1e-10  # float64: exact
    assert sum(result["num_grads"]) == 161  # every ResNet50 parameter got its gradient
    assert worker.returncode == 0 and "the master closed the cluster" in worker.stdout


def test_ppkit_pipeline_listen_verify(two_hosts, no_leftovers):
    """The user's command on machine A, `ppkit worker` on machine B: no code edited anywhere."""
    key = os.urandom(32).hex()
    where = f"{two_hosts.master.address}:29600"
    master, worker = two_hosts.run_both(
        [PY, "-m", "ppkit", "pipeline", "--listen", where, "--placement", "master:cpu,worker1:cpu",
         "--verify", "--batch-size", "4", "--image-size", "32", "--num-batches", "1",
         "--microbatch-sizes", "2"],
        [PY, "-m", "ppkit", "worker", "--connect", where, "--name", "worker1"],
        env=host_env(key, OMP_NUM_THREADS="1"), timeout=200)
    assert master.returncode == 0, master.stdout + master.stderr[-3000:]
    assert "placement master:cpu,worker1:cpu" in master.stdout
    assert "verify: max |pipeline - local torchvision ResNet50|" in master.stdout
    assert "OK (tolerance" in master.stdout
    assert "worker1: started rank 0" in worker.stdout and worker.returncode == 0
