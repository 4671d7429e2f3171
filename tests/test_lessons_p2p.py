"""Lesson 1: the seed's send/recv run unchanged; a missing send is caught and explained; the timeline."""

from __future__ import annotations

import pytest

import ppkit
from ppkit.lessons import p2p, seed001, timeline


@pytest.mark.parametrize("fn", [seed001.test_send_recv_sync, seed001.test_send_recv_async])
def test_seed_send_recv_runs_unchanged(cluster2, capsys, fn):
    assert cluster2.run(fn) == [None, None]
    out = capsys.readouterr().out
    assert "[rank 0] Rank  0  has data  tensor(1.)" in out
    assert "[rank 1] Rank  1  has data  tensor(1.)" in out


@pytest.mark.slow
def test_seed_send_recv_with_four_ranks_ranks_above_one_also_recv(cluster4):
    # the article's `else: recv(src=0)` makes ranks 2 and 3 wait for a send that never comes
    with pytest.raises(ppkit.JobTimeoutError) as info:
        cluster4.run(seed001.test_send_recv_sync, timeout=3)
    assert info.value.ranks == [2, 3]
    explained = p2p.explain_timeout(info.value, 4)
    assert "rank 2 is blocked in dist.recv, called from test_send_recv_sync()" in explained
    assert "rank(s) [0, 1] had already returned" in explained
    cluster4.restart()


@pytest.mark.slow
def test_recv_without_send_is_caught_and_explained(cluster2):
    with pytest.raises(ppkit.JobTimeoutError) as info:
        cluster2.run(p2p.recv_without_send, timeout=2)
    err = info.value
    assert err.ranks == [1]
    call = p2p.blocked_call(1, err.stacks[1])
    assert call.torch_call == "dist.recv"
    assert call.function == "recv_without_send"
    assert call.code.startswith("dist.recv(tensor, src=0)")
    assert call.filename.endswith("p2p.py")
    text = p2p.explain_timeout(err, 2)
    assert text.splitlines()[0].startswith("rank 1 is blocked in dist.recv, called from recv_without_send()")
    assert "rank(s) [0] had already returned" in text
    with pytest.raises(ppkit.ClusterStateError, match="restart"):
        cluster2.run(p2p.recv_without_send)
    cluster2.restart()
    assert cluster2.run(lambda rank, size: rank) == [0, 1]


def test_blocked_call_outside_torch():
    stack = ('  File "/x/worker.py", line 220, in _run_job\n    value = fn(x)\n'
             '  File "<cell>", line 3, in spin\n')
    call = p2p.blocked_call(0, stack)
    assert (call.torch_call, call.function, call.lineno, call.code) == ("", "spin", 3, "")
    assert str(call) == "rank 0 is still running spin() line 3"
    assert p2p.blocked_call(0, "") is None


@pytest.mark.parametrize("world", ["cluster2", "cluster4"])
def test_waiting_timeline(world, request):
    cluster = request.getfixturevalue(world)
    if cluster.state == "broken":
        cluster.restart()
    spans = cluster.run(p2p.waiting_demo, slow_s=0.3, fast_s=0.05)
    assert all(s == [] for s in spans[2:])
    flat = timeline.flatten(spans)
    by = {(s["phase"], s["rank"], s["label"]): s for s in flat}
    # causality, whatever the machine's load: a recv cannot end before its send started
    assert by[("blocking", 1, "recv")]["end"] >= by[("blocking", 0, "send")]["start"]
    # gloo: the early sender's send cannot end before the receiver posted its recv
    assert by[("early sender", 0, "send")]["end"] >= by[("early sender", 1, "recv")]["start"]
    waits = {(w["phase"], w["rank"]): w for w in timeline.who_waited(spans)}
    assert waits[("blocking", 1)]["peer"] == 0 and waits[("blocking", 1)]["peer_was"] == "work"
    assert waits[("blocking", 1)]["waited_s"] > waits[("blocking", 0)]["waited_s"]
    assert waits[("early sender", 0)]["waited_s"] > waits[("early sender", 1)]["waited_s"]
    text = timeline.describe(spans)
    assert "[blocking] rank 1 waited" in text and "for rank 0 while rank 0 was busy with work" in text
    fig = timeline.plot(spans)
    labels = {t.get_text() for t in fig.axes[0].texts}
    assert {"send", "recv", "irecv", "isend"} <= labels


def test_describe_says_when_nobody_waited():
    spans = [[{"rank": 0, "label": "send", "kind": "comm", "peer": 1, "phase": "p",
               "start": 1.0, "end": 1.001}]]
    assert timeline.describe(spans) == "[p] nobody waited longer than 0.02 s"
