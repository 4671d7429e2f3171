"""Lesson 3: hand-averaged gradients == DDP's == one process on the whole batch; init methods; samplers."""

from __future__ import annotations

import pytest
import torch

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import data_parallel as dp
from ppkit.lessons import rank_variables


@pytest.mark.slow
@pytest.mark.parametrize("world", ["cluster2", "cluster4"])
def test_manual_equals_ddp_equals_whole_batch(world, request):
    cluster = request.getfixturevalue(world)
    if cluster.state == "broken":
        cluster.restart()
    whole = dp.whole_batch_gradients(batch_size=24)
    manual = cluster.run(dp.manual_gradients, batch_size=24)
    ddp = cluster.run(dp.ddp_gradients, batch_size=24)
    for rank in range(cluster.world_size):
        assert dp.max_difference(manual[rank], whole) < 1e-6
        assert dp.max_difference(ddp[rank], whole) < 1e-6
    # the ranks' local gradients alone are not the whole batch's: the averaging matters
    local = cluster.run(lambda rank, size: {n: p.grad for n, p in dp.local_backward(rank, size).named_parameters()})
    assert dp.max_difference(local[0], whole) > 1e-3


@pytest.mark.slow
def test_training_with_ddp_matches_one_process(cluster4):
    if cluster4.state == "broken":
        cluster4.restart()
    single = dp.train(0, 1, steps=4)
    ranks = cluster4.run(dp.train, steps=4)
    for r in ranks:
        for name, value in single["params"].items():
            assert torch.allclose(r["params"][name], value, atol=1e-5), name
    assert single["losses"][-1] < single["losses"][0]


def test_uneven_batch_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="batch_size 10 does not split evenly over 4 ranks.*repeat 2"):
        dp.local_backward(0, 4, batch_size=10)


def test_shard_indices_are_distributed_sampler_strides():
    assert dp.shard_indices(8, 1, 4) == [1, 5]
    assert dp.sampler_assignment(10, 4) == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]  # padded
    epoch0 = dp.sampler_assignment(8, 2, shuffle=True, epoch=0)
    epoch1 = dp.sampler_assignment(8, 2, shuffle=True, epoch=1)
    assert sorted(epoch0[0] + epoch0[1]) == list(range(8)) and epoch0 != epoch1


def test_data_parallel_is_a_no_op_without_gpus():
    info = dp.data_parallel_here()
    assert info["output_equals_plain_model"]
    if torch.cuda.is_available():  # run on the GPU machine: the outputs gathered on GPU 0
        assert info["device_ids"] == list(range(torch.cuda.device_count())) and info["output_device"] == "cuda:0"
    else:
        assert info["device_ids"] == [] and info["output_device"] == "cpu"


@pytest.fixture(scope="module")
def bare2():
    with ppkit.Cluster(2, "gloo", process_group=False, timeout=60) as cluster:
        yield cluster


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_methods(bare2, tmp_path, method):
    port = dp.free_port()
    init, env = {"env": ("env://", {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}),
                 "tcp": (f"tcp://127.0.0.1:{port}", None),
                 "file": (f"file://{tmp_path}/rendezvous", None)}[method]
    results = bare2.run(dp.init_demo, init, env)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 and r["all_reduce"] == 3.0 for r in results)
    assert results[0]["init_method"] == init


def test_init_demo_refuses_a_rank_already_in_a_group(cluster2):
    with pytest.raises(ppkit.RemoteError, match="already in a process group"):
        cluster2.run(dp.init_demo, "env://")


def test_slurm_env_feeds_read_launch_env():
    from ppkit.cluster.tools.env import read_launch_env

    envs = [read_launch_env(rank_variables.slurm_env(p, 4, 2, "node[07-08]")) for p in range(4)]
    assert [(e.rank, e.local_rank, e.master_addr) for e in envs] == [
        (0, 0, "node07"), (1, 1, "node07"), (2, 0, "node07"), (3, 1, "node07")]
    with pytest.raises(ConfigError, match="does not fit 2 node"):
        rank_variables.slurm_env(0, 6, 2, "node[07-08]")


@pytest.mark.slow
def test_torchrun_sets_what_read_launch_env_reads():
    records = rank_variables.torchrun_env(nnodes=1, nproc_per_node=2)
    assert [(r["rank"], r["local_rank"], r["world_size"], r["source"]) for r in records] == [
        (0, 0, 2, "torchrun"), (1, 1, 2, "torchrun")]
    assert {r["master_addr"] for r in records} == {"127.0.0.1"}
