"""transport/sending.py: one message to several connections, within a deadline, readable by the
peer's ordinary ``conn.recv()``; a peer that reads nothing cannot hold the sender."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from ppkit.transport import sending
from ppkit.transport.messages import CellSource, Run, Shutdown


@pytest.fixture
def pipes():
    made = [multiprocessing.Pipe() for _ in range(3)]
    yield made
    for a, b in made:
        a.close()
        b.close()


@pytest.mark.parametrize("size", [0, 100, 16_000, 5_000_000])
def test_the_peer_reads_what_conn_send_would_have_written(pipes, size):
    msg = Run(3, b"x" * size, (CellSource("cell", "a\n"),))
    readers = {}
    for key, (_, theirs) in enumerate(pipes):  # read while it is written: 5 MB fills any buffer
        readers[key] = box = []
        threading.Thread(target=lambda c=theirs, b=box: b.append(c.recv()), daemon=True).start()
    out = sending.Broadcast({key: ours for key, (ours, _) in enumerate(pipes)}, msg)
    out.send(time.monotonic() + 30)
    assert out.complete == [0, 1, 2] and out.unsent == [] and out.partial == [] and not out.gone
    deadline = time.monotonic() + 10
    while any(not box for box in readers.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(box == [msg] for box in readers.values())


def test_a_peer_that_reads_nothing_cannot_hold_the_sender_past_its_deadline(pipes):
    (ours0, theirs0), (ours1, theirs1), _ = pipes
    reader = threading.Thread(target=theirs0.recv, daemon=True)  # rank 0 reads; rank 1 is "stopped"
    reader.start()
    out = sending.Broadcast({0: ours0, 1: ours1}, Run(1, b"y" * 50_000_000))
    started = time.monotonic()
    out.send(started + 1.0)
    assert time.monotonic() - started < 3.0
    assert out.complete == [0] and out.unsent == [1] and out.partial == [1]


def test_a_closed_peer_or_a_missing_connection_is_gone(pipes):
    (ours0, theirs0), (ours1, _), _ = pipes
    theirs0.close()
    out = sending.Broadcast({0: ours0, 1: ours1, 2: None}, Shutdown())
    out.send(time.monotonic() + 5)
    assert sorted(out.gone) == [0, 2] and out.complete == [1]


def test_send_within_shuts_a_connection_it_left_half_written(pipes):
    (ours, theirs), _, _ = pipes
    assert sending.send_within(ours, Shutdown(), 1.0) and theirs.recv() == Shutdown()
    assert not sending.send_within(ours, Run(1, b"z" * 50_000_000), 0.5)
    with pytest.raises((EOFError, OSError)):
        while True:  # what got through, then the end: no half message is ever read as one
            theirs.recv_bytes()


def test_without_non_blocking_sends_it_sends_as_before(pipes, monkeypatch):
    monkeypatch.setattr(sending, "_DONTWAIT", 0)  # as on Windows
    (ours, theirs), _, _ = pipes
    out = sending.Broadcast({0: ours}, Shutdown("bye"))
    out.send(time.monotonic() + 5)
    assert out.complete == [0] and theirs.recv() == Shutdown("bye")
