"""The functions of the source article "torch分布式通信基础" (seed 001), as written there.

Only the comments are translated, the indentation made uniform, and the ``init_process`` /
``mp.Process`` scaffolding left out:
``cluster.run(fn)`` plays that part and calls ``fn(rank, size)`` on every rank. The bodies are the
article's, unchanged, to show that a plain ``fn(rank, size)`` runs on a ppkit cluster as it is.
The lessons compute and check the same results with ``ppkit.lessons.p2p`` and ``collectives``.
"""

import torch
import torch.distributed as dist

# Point-to-point (article section 1) -----------------------------------------------------------


# synchronous peer-to-peer transfer
def test_send_recv_sync(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)  # dst: the rank to send to
    else:
        dist.recv(tensor=tensor, src=0)  # src: the rank to receive from
    print('Rank ', rank, ' has data ', tensor[0])


# asynchronous
def test_send_recv_async(rank, size):
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
    else:
        req = dist.irecv(tensor=tensor, src=0)
    req.wait()
    print('Rank ', rank, ' has data ', tensor[0])


# Collectives (article section 2, run there with size = 4) ---------------------------------------

def test_broadcast(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 2
    else:
        tensor += 1
    dist.broadcast(tensor=tensor, src=0)  # src: the rank whose tensor is broadcast
    print("******test_broadcast******")
    print('Rank ', rank, ' has data ', tensor)  # every rank ends with 2


def test_scatter(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor_list = [torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([3.0]), torch.tensor([4.0])]
        dist.scatter(tensor, scatter_list=tensor_list, src=0)
    else:
        dist.scatter(tensor, scatter_list=[], src=0)
    print("******test_scatter******")
    print('Rank ', rank, ' has data ', tensor)  # result: [[1], [2], [3], [4]]


def test_reduce(rank, size):
    tensor = torch.ones(1)
    dist.reduce(tensor=tensor, dst=0)  # dst: the rank that receives the reduction; default op is sum
    print("******test_reduce******")
    print('Rank ', rank, ' has data ', tensor)


def test_all_reduce(rank, size):
    tensor = torch.ones(1)
    dist.all_reduce(tensor=tensor, op=dist.ReduceOp.SUM)
    print("******test_all_reduce******")
    print('Rank ', rank, ' has data ', tensor)  # every rank ends with 4


def test_gather(rank, size):
    tensor = torch.ones(1)
    if rank == 0:
        output = [torch.zeros(1) for _ in range(size)]
        dist.gather(tensor, gather_list=output, dst=0)
    else:
        dist.gather(tensor, gather_list=[], dst=0)
    if rank == 0:
        print("******test_gather******")
        print('Rank ', rank, ' has data ', output)  # result: [[1,1,1,1]]


def test_all_gather(rank, size):
    output = [torch.zeros(1) for _ in range(size)]
    tensor = torch.ones(1)
    dist.all_gather(output, tensor)
    print("******test_all_gather******")
    print('Rank ', rank, ' has data ', output)  # every rank ends with [1,1,1,1]
