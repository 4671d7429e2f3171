"""The hang watch's "for N s no rank printed or finished" holds: output that arrives while the
notebook waits for the ranks moves the watch's next look, as a result does."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
from test_spawn import assert_none_left

import ppkit
from ppkit.cluster.hang_watch import waits_on_peers
from ppkit.lessons.data_parallel import free_port

pytestmark = pytest.mark.timeout(240)
PARTS = 16  # one every 0.5 s: an 8 s run


def recv_while_a_thread_prints_and_sends(i, port):
    """The main thread waits in dist.recv (inside torch.distributed, as a hung rank's would) while a
    producer thread prints, then sends the other rank a part, every 0.5 s."""
    print(f"rank {i} starts", flush=True)  # silence at the start is not what this test is about
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    print(f"rank {i} joined", flush=True)
    other = 1 - i

    def produce():
        for part in range(PARTS):
            time.sleep(0.5)
            print(f"rank {i} sends part {part}", flush=True)
            dist.send(torch.full((1,), float(part)), dst=other)

    producer = threading.Thread(target=produce)
    producer.start()
    got = torch.zeros(1)
    for part in range(PARTS):
        dist.recv(got, src=other)
        if got.item() != part:
            raise AssertionError(f"rank {i} got part {got.item()} where part {part} was due")
    producer.join()
    dist.destroy_process_group()


def test_ranks_that_print_every_half_second_are_not_called_hung(monkeypatch, capsys):
    monkeypatch.setenv("PPKIT_HANG_S", "3")
    started = time.monotonic()
    ppkit.spawn(recv_while_a_thread_prints_and_sends, args=(free_port(),), nprocs=2, timeout=120)
    took = time.monotonic() - started
    out = capsys.readouterr().out
    assert f"[rank 1] rank 1 sends part {PARTS - 1}" in out, out
    assert took >= PARTS * 0.5, took  # the run lasted the 8 s the watch had to stay quiet through
    assert "possibly hung" not in out, out
    assert_none_left()


TICKS = 6  # one every 0.5 s: 3 s of output before the hang


def print_then_both_recv(i, port):
    """Each rank prints for 3 s, then waits in a recv from the other: a real hang, after output."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    for tick in range(TICKS):
        print(f"rank {i} tick {tick}", flush=True)
        time.sleep(0.5)
    dist.recv(torch.zeros(1), src=1 - i)


def test_ranks_that_printed_then_hung_are_called_hung_once_after_their_last_line(monkeypatch, capsys):
    monkeypatch.setenv("PPKIT_HANG_S", "2")
    with pytest.raises(ppkit.JobTimeoutError):  # the test's own limit: the run would go on
        ppkit.spawn(print_then_both_recv, args=(free_port(),), nprocs=2, timeout=15)
    out = capsys.readouterr().out
    assert out.count("[ppkit] possibly hung") == 1, out
    last = max(out.index(f"[rank {r}] rank {r} tick {TICKS - 1}") for r in (0, 1))
    assert out.index("[ppkit] possibly hung") > last, out  # silence counted from the last line, not the start
    assert_none_left()


def ddp_backward_against_a_recv(i, port):
    """Rank 0 waits for its gradients' all_reduce inside autograd (DDP's reducer); rank 1 never
    reaches backward: it waits in a recv that never comes."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=i, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    if i == 0:
        model(torch.ones(2, 4)).sum().backward()
    else:
        dist.recv(torch.zeros(1), src=0)


def test_ddps_reducer_waiting_inside_autograd_is_found_by_the_record_not_the_stack(monkeypatch, capsys):
    """What docs/debugging.md says of the hang rule: the stack alone misses DDP's reducer."""
    monkeypatch.setenv("PPKIT_HANG_S", "3")
    with pytest.raises(ppkit.JobTimeoutError) as info:  # the test's own limit: the run would go on
        ppkit.spawn(ddp_backward_against_a_recv, args=(free_port(),), nprocs=2, timeout=10)
    stack = info.value.stacks[0]
    assert "torch/autograd/graph.py" in stack and not waits_on_peers(stack), stack  # the stack rule misses it
    out = capsys.readouterr().out
    assert out.count("[ppkit] possibly hung") == 1, out  # the flight record's all_reduce, started, found it
    assert "rank 0: all_reduce #" in out, out
    assert_none_left()
