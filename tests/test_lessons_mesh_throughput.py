"""Lesson 13, throughput: a mesh's step time predicted from measured compute and links (known inputs give known
answers), the meshes that fit a budget ranked by it, refusals that say what to do, and a real small measurement."""

from __future__ import annotations

import math

import pytest
import torch

import ppkit
from ppkit.errors import ConfigError
from ppkit.lessons import composition as comp
from ppkit.lessons import mesh_costs as mc
from ppkit.lessons import mesh_links as ml
from ppkit.lessons import mesh_throughput as mt

pytestmark = pytest.mark.timeout(600)

MS = 1e-3


def _links(latency=MS, bandwidth=1e6, n=(2, 4)):
    return {(kind, k): mt.Link(kind, k, latency, bandwidth) for kind in mt.KINDS for k in n}


CALLS_222 = {"dp": {"all_gather": 7, "reduce_scatter": 3}, "pp": {"send": 3, "recv": 3}, "tp": {"all_reduce": 24}}
SENT_222 = {"dp": 10_000.0, "pp": 2_000.0, "tp": 24_000.0}


def test_prediction_adds_compute_bubble_latency_and_bytes():
    links = _links()
    links["reduce_scatter", 2] = mt.Link("reduce_scatter", 2, 2 * MS, 5e5)  # dp's slowest link sets its bytes' time
    links["send_recv", 2] = mt.Link("send_recv", 2, 0.5 * MS, 2e6)
    p = mt.predict((2, 2, 2), 0.010, links, CALLS_222, SENT_222)
    want = {"compute": 0.010, "optimizer": 0.0,  # a number is forward and backward alone
            "dp": 7 * MS + 3 * 2 * MS + 10_000 / 5e5,
            "pp": 3 * 0.5 * MS + 2_000 / 2e6,      # a recv is the other side of a send: not counted twice
            "tp": 24 * MS + 24_000 / 1e6}
    # the bubble stretches each micro-batch's whole slot, its sends and tp's all_reduces too; dp comes once
    want["bubble"] = (want["compute"] + want["pp"] + want["tp"]) * (2 - 1) / 2
    assert p.parts == pytest.approx(want)
    assert p.step_s == pytest.approx(sum(want.values()))
    assert p.tokens == comp.SIZE.batch * comp.SIZE.seq == 64
    assert p.tokens_per_s == pytest.approx(64 / sum(want.values()))


def test_a_split_compute_stretches_only_forward_and_backward():
    """Adam's step runs once, after the pipeline has flushed: the bubble stretches forward and backward (and the
    slot's sends and all_reduces), not the optimizer."""
    split = mt.predict((2, 2, 2), mt.Compute(0.010, 0.004), _links(), CALLS_222, SENT_222)
    whole = mt.predict((2, 2, 2), 0.010, _links(), CALLS_222, SENT_222)
    assert split.parts["compute"] == 0.010 and split.parts["optimizer"] == 0.004
    assert split.parts["bubble"] == pytest.approx((0.010 + split.parts["pp"] + split.parts["tp"]) * (2 - 1) / 2)
    assert split.parts["bubble"] == whole.parts["bubble"]
    assert split.step_s == pytest.approx(whole.step_s + 0.004)  # the optimizer once, unstretched
    assert mt.Compute(0.010, 0.004).total_s == pytest.approx(0.014)


def _fake_step_times(rank, world_size, meshes, size, reps, alone):
    return {mesh: (0.030 + rank * 0.01, 0.002 + (3 - rank) * 0.001) for mesh in meshes}


def test_measure_compute_keeps_forward_backward_and_the_optimizer_apart():
    class Four:
        world_size = 4

        def run(self, fn, **kwargs):
            assert fn is mt._compute_times
            return [_fake_step_times(r, 4, **kwargs) for r in range(4)]

    compute = mt.measure_compute(Four(), [(2, 2, 1)])
    assert compute[(2, 2, 1)] == mt.Compute(0.060, 0.002)  # the slowest rank by its whole step


def test_the_bubble_is_gpipes_share_of_the_pipelined_part():
    """Narayanan et al. 2021: the bubble is (pp - 1) / m of the micro-batches' forward and backward time; the
    lesson's extension puts the slot's tp all_reduces and sends in the slot too: they all wait in it, dp's
    once-a-step traffic not."""
    calls = {"dp": {"all_gather": 2}, "pp": {"send": 2, "recv": 2}, "tp": {"all_reduce": 4}}
    for pp, m in ((2, 2), (4, 2)):
        p = mt.predict((1, pp, 8 // pp), 0.1, _links(n=(2, 4, 8 // pp)), calls, {})
        pipelined = p.parts["compute"] + p.parts["pp"] + p.parts["tp"]
        assert p.parts["pp"] > 0 and p.parts["tp"] > 0
        assert p.parts["bubble"] / (pipelined + p.parts["bubble"]) == pytest.approx((pp - 1) / (m + pp - 1))
    with_dp = mt.predict((2, 2, 2), 0.1, _links(), calls, {})
    assert with_dp.parts["dp"] > 0
    assert with_dp.parts["bubble"] == pytest.approx((0.1 + with_dp.parts["pp"] + with_dp.parts["tp"]) / 2)
    assert mt.predict((4, 1, 2), 0.1, _links(), calls, {}).parts["bubble"] == 0  # no pipeline, no bubble


def test_a_dimension_of_degree_one_costs_nothing():
    p = mt.predict((8, 1, 1), 0.0, {}, {"pp": {"send": 5}, "tp": {"all_reduce": 9}}, {"tp": 1e6})
    assert p.parts["pp"] == p.parts["tp"] == 0
    with pytest.raises(ConfigError, match=r"all_gather over 8 ranks.*groups=\(2, 8\)"):
        mt.predict((8, 1, 1), 0.0, {}, {"dp": {"all_gather": 1}}, {})


def test_ranking_keeps_what_fits_and_puts_the_fastest_first():
    links = _links()
    preds = [mt.predict(mesh, 0.01, links, CALLS_222, SENT_222) for mesh in ((2, 2, 2), (4, 2, 1), (2, 4, 1))]
    # (4, 2, 1) and (2, 4, 1) have no tp: 24 all_reduces fewer. (2, 4, 1)'s deeper pipeline idles more.
    memory = {(2, 2, 2): 80_000, (4, 2, 1): 95_000, (2, 4, 1): 70_000}
    assert [p.mesh for p in mt.rank_meshes(preds, memory, 100_000)] == [(4, 2, 1), (2, 4, 1), (2, 2, 2)]
    assert [p.mesh for p in mt.rank_meshes(preds, memory, 90_000)] == [(2, 4, 1), (2, 2, 2)]  # (4, 2, 1) does not fit
    assert mt.rank_meshes(preds, memory, 1_000) == []
    with pytest.raises(ConfigError, match=r"no memory given for meshes \[\(2, 4, 1\)\]"):
        mt.rank_meshes(preds, {(2, 2, 2): 1, (4, 2, 1): 1}, 100_000)


def test_ring_bytes():
    assert mt.ring_bytes("all_reduce", 1000, 4) == 1500
    assert mt.ring_bytes("all_gather", 1000, 4) == 3000
    assert mt.ring_bytes("reduce_scatter", 1000, 4) == 750
    assert mt.ring_bytes("send_recv", 1000, 4) == 1000


def _sent_by_link_calls(rank, world_size, nbytes):
    """What CommLog (the count that ``sent`` comes from) sees each timed link call of ``measure_links`` send."""
    from ppkit.lessons import composition_measure as cm

    out = {}
    for n in (2, 4):
        mesh3d = comp.device_mesh((world_size // n, 1, n))
        for kind in ("all_reduce", "all_gather", "reduce_scatter"):  # a send's bytes are its tensor's
            x, buf = mt.link_buffers(kind, nbytes, n)
            log = cm.CommLog(mesh3d)
            with log:
                mt.link_call(kind, mesh3d["tp"].get_group(), x, buf)
            out[kind, n] = (x.nbytes, log.sent["tp"])
    return out


def _profiled_reduce_scatter(rank, world_size):
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    x, out = ml.link_buffers("reduce_scatter", 4096, world_size)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ml.link_call("reduce_scatter", dist.group.WORLD, x, out)
    return sorted({e.name for e in prof.events() if "gloo" in e.name or "reduce_scatter" in e.name})


def test_gloos_reduce_scatter_is_an_all_reduce_underneath(cluster2):
    """What Link's docstring says: torch 2.14's ProcessGroupGloo runs _reduce_scatter_base as an all_reduce of the
    whole input (then copies the rank's part out), so its link does not send a ring's (n - 1) / n of it."""
    for names in cluster2.run(_profiled_reduce_scatter):
        assert "gloo:all_reduce" in names, names
        assert not any(n.startswith("gloo:reduce_scatter") for n in names), names


def test_link_bandwidths_divide_the_bytes_each_call_sends(cluster4):
    """The bandwidth of a link is its extra wire bytes over its extra time: those bytes must be what the timed call
    sends, as CommLog counts them (a reduce_scatter of an input of S bytes sends (n - 1) / n x S, not less)."""
    for (kind, n), (input_bytes, sent) in cluster4.run(_sent_by_link_calls, nbytes=4096)[0].items():
        assert sent == mt.ring_bytes(kind, input_bytes, n), (kind, n)
        assert input_bytes == 4096, (kind, n)  # the size measure_links names is the call's input


class _FakeLinks:
    """A world of 4 where each collective takes 1 ms plus the bytes a ring sends for the input it is really handed,
    at 1e8 bytes/s (all_reduce 2 (n - 1) / n of its tensor, all_gather (n - 1) x its shard, reduce_scatter (n - 1)
    / n of its input, a send its tensor): the clock and the calls _link_times makes, faked; its buffers, real."""
    LATENCY, BANDWIDTH, world_size = 1e-3, 1e8, 4

    def __init__(self, monkeypatch):
        import types

        self.now, self.n = 0.0, None
        fake_dist = types.SimpleNamespace(
            all_reduce=lambda x, group: self._spend(2 * (self.n - 1) / self.n * x.nbytes),
            barrier=lambda: None, get_rank=lambda group: 0, get_global_rank=lambda group, r: r,
            send=lambda x, peer: self._spend(x.nbytes), recv=lambda x, peer: self._spend(x.nbytes))
        monkeypatch.setattr(ml, "dist", fake_dist)
        monkeypatch.setattr(ml, "time", types.SimpleNamespace(perf_counter=lambda: self.now))
        monkeypatch.setattr(ml, "_all_gather", lambda out, x, group: self._spend((self.n - 1) * x.nbytes))
        monkeypatch.setattr(ml, "_reduce_scatter", lambda out, x, group: self._spend((self.n - 1) / self.n * x.nbytes))
        monkeypatch.setattr(ml, "_group", self._group)

    def _group(self, world_size, n):
        self.n = n
        return None

    def _spend(self, wire_bytes):
        self.now += self.LATENCY + wire_bytes / self.BANDWIDTH

    def run(self, fn, **kwargs):
        return [fn(0, self.world_size, **kwargs)]


def test_measure_links_turns_two_sizes_into_latency_and_bandwidth(monkeypatch):
    """The buffers _link_times really hands each call give the links back: the latency is the small call's (its
    bytes add under 5%), the bandwidth the one the fake calls run at, for every kind and group (a reduce_scatter
    handed the n-times-larger tensor as its input would read n times too slow)."""
    links = mt.measure_links(_FakeLinks(monkeypatch), groups=(2, 4), sizes=(1024, 1 << 18))
    assert set(links) == {(k, n) for k in mt.KINDS for n in (2, 4)}
    for (kind, n), link in links.items():
        assert _FakeLinks.LATENCY <= link.latency_s < 1.05 * _FakeLinks.LATENCY, (kind, n)
        assert link.bytes_per_s == pytest.approx(_FakeLinks.BANDWIDTH), (kind, n)


def test_the_local_stage_holds_a_tp_ranks_share():
    """What measure_compute times: a tp rank's slice of each matrix, the norms whole, the stage's blocks."""
    whole = sum(p.numel() for p in comp.Transformer().parameters())
    stages = [mt.local_stage((1, 2, 1), s) for s in (0, 1)]
    assert sum(p.numel() for m in stages for p in m.parameters()) == whole == comp.SIZE.params()
    tp2 = mt.local_stage((2, 2, 2), 1)
    block = tp2.layers["2"]
    assert list(tp2.layers) == ["2", "3"] and tp2.embed is None and tp2.head is not None
    assert block.q.weight.shape == (8, 16) and block.o.weight.shape == (16, 8) and block.fc2.weight.shape == (16, 32)
    x = torch.randn(2, comp.SIZE.seq, comp.SIZE.d_model)
    assert tp2(x).shape == (2, comp.SIZE.seq, comp.SIZE.vocab)  # two heads of 4 per rank run the same code


def test_measure_links_refuses_groups_that_do_not_tile_the_world():
    class Four:
        world_size = 4

    with pytest.raises(ConfigError, match=r"groups \[3\].*divides the cluster's 4 ranks"):
        mt.measure_links(Four(), groups=(2, 3))


@pytest.mark.slow
def test_a_real_small_measurement_predicts_and_times_a_mesh():
    """4 ranks: links, compute (all at once and alone), one mesh's calls counted, its prediction, its real step."""
    with ppkit.Cluster(4, "gloo", timeout=300) as cluster:
        links = mt.measure_links(cluster, groups=(2, 4), reps=3)
        assert set(links) == {(k, n) for k in mt.KINDS for n in (2, 4)}
        assert all(0 < link.latency_s < 5 and link.bytes_per_s > 0 for link in links.values())
        meshes = [(2, 2, 1), (2, 1, 2)]
        compute = mt.measure_compute(cluster, meshes, reps=2)
        assert all(0 < compute[m].forward_backward_s < 5 and 0 < compute[m].optimizer_s < 5 for m in meshes)
        alone, together = mt.core_sharing(cluster, (2, 2, 1), reps=2)
        assert 0 < alone < 5 and 0 < together < 5
        measured = mc.measure(cluster, (2, 2, 1))
        calls = mt.busiest_calls(measured)
        assert calls["tp"] == {} and set(calls["dp"]) == {"all_gather", "reduce_scatter"} and calls["pp"]["send"] >= 2
        p = mt.predict((2, 2, 1), compute[(2, 2, 1)], links, calls, mc.comm_formula((2, 2, 1)))
        assert p.parts["tp"] == 0 and p.parts["dp"] > 0 and p.parts["pp"] > 0 and math.isfinite(p.step_s)
        step = mt.measure_steps(cluster, (2, 2, 1), steps=2)
        assert 0 < step < 60
        assert mt.rank_meshes([p], {(2, 2, 1): max(measured.memory())}, max(measured.memory())) == [p]
        with pytest.raises(ConfigError, match="mesh 2x2x2 has 8 ranks, but the world has 4"):
            mt.measure_steps(cluster, (2, 2, 2))
        assert cluster.state == "ready"  # refused before anything ran


# -- the exercise: predict_step (docs/exercises.md lists these wrong answers) ------------------------------------

def _step(mesh, compute_s, optimizer_s, links, calls, sent, m, bubble="right", recv=False, send_n=2,
          with_bytes=True, stretch=("pp", "tp"), optimizer="once"):
    pp = mesh[1]
    cost = {}
    for dim, n in zip(comp.DIMS, mesh):
        cost[dim], used = 0.0, []
        for call, count in calls.get(dim, {}).items():
            if n == 1 or (call == "recv" and not recv):
                continue
            link = links["send_recv", send_n if send_n == 2 else n] if call in ("send", "recv") else links[call, n]
            cost[dim] += count * link.latency_s
            used.append(link)
        if used and with_bytes:
            cost[dim] += sent.get(dim, 0) / min(link.bytes_per_s for link in used)
    slots = compute_s + sum(cost[d] for d in stretch) + (optimizer_s if optimizer == "stretched" else 0.0)
    share = {"right": (pp - 1) / m, "none": 0.0, "of the step": (pp - 1) / (m + pp - 1)}[bubble]
    once = optimizer_s if optimizer == "once" else 0.0
    return slots * (1 + share) + sum(cost[d] for d in comp.DIMS if d not in stretch) + once


WRONG_STEPS = {
    "only compute stretched (the old model)": (dict(stretch=()), r"you stretched only the compute by \(m \+ pp - 1\) "
                                               r"/ m: tp's all_reduces and the pipeline's sends"),
    "sends not stretched": (dict(stretch=("tp",)), "the pipeline's sends are not stretched"),
    "tp not stretched": (dict(stretch=("pp",)), "tp's all_reduces are not stretched"),
    "dp stretched too": (dict(stretch=("dp", "pp", "tp")), "dp's traffic is stretched too"),
    "no bubble": (dict(bubble="none"), "GPipe's bubble is left out"),
    "bubble as a share of the step": (dict(bubble="of the step"), r"of the whole step, not of the slots"),
    "recv counted": (dict(recv=True), "each recv is counted as a call too"),
    "sends over pp's groups": (dict(send_n="pp"), r"the sends use the link of groups of pp = 4"),
    "no bytes": (dict(with_bytes=False), "the bytes' time is left out"),
    "optimizer stretched": (dict(optimizer="stretched"), "Adam's step is stretched by the bubble"),
    "optimizer left out": (dict(optimizer="left out"), "Adam's step is left out"),
}


def test_predict_step_passes_the_solution_and_the_same_formula_written_otherwise():
    from ppkit.exercises import check_throughput, solutions

    assert check_throughput.check_predict_step(solutions.predict_step).passed
    assert check_throughput.check_predict_step(_step).passed


def test_predict_step_refuses_the_lessons_own_prediction():
    from ppkit.errors import ExerciseFailed
    from ppkit.exercises import check_throughput

    def lessons(mesh, compute_s, optimizer_s, links, calls, sent, m):
        return mt.predict(mesh, mt.Compute(compute_s, optimizer_s), links, calls, sent).step_s

    with pytest.raises(ExerciseFailed, match="LessonFormulaUsed: your function called mesh_throughput.predict, the "
                                             "lesson's own prediction"):
        check_throughput.check_predict_step(lessons)
    assert mt.predict((2, 2, 2), 0.01, _links(), CALLS_222, SENT_222).step_s > 0  # put back after the check


def test_predict_step_names_both_mistakes_where_they_give_one_number():
    """2x4x1 has no tp: leaving the sends unstretched is stretching only the compute there, so both are named."""
    from ppkit.errors import ExerciseFailed
    from ppkit.exercises import check_throughput

    with pytest.raises(ExerciseFailed, match=r"mesh 2x4x1: .*you stretched only the compute.*; or the pipeline's "
                                             r"sends are not stretched"):
        check_throughput.check_predict_step(lambda *args: _step(*args, stretch=("tp",)))


@pytest.mark.parametrize("wrong", sorted(WRONG_STEPS))
def test_predict_step_names_each_wrong_answer(wrong):
    from ppkit.errors import ExerciseFailed
    from ppkit.exercises import check_throughput

    options, message = WRONG_STEPS[wrong]
    with pytest.raises(ExerciseFailed, match=message):
        check_throughput.check_predict_step(lambda *args: _step(*args, **options))


def test_predict_step_says_milliseconds_and_what_else_is_off():
    from ppkit.errors import ExerciseFailed
    from ppkit.exercises import check_throughput

    with pytest.raises(ExerciseFailed, match="the seconds are milliseconds"):
        check_throughput.check_predict_step(lambda *args: 1e3 * _step(*args))
    with pytest.raises(ExerciseFailed, match=r"mesh 2x2x2: returned 1 s, expected .* the parts are compute 50 ms"):
        check_throughput.check_predict_step(lambda *args: 1.0)
    with pytest.raises(ExerciseFailed, match="expected a number of seconds, got str"):
        check_throughput.check_predict_step(lambda *args: "0.1 s")
