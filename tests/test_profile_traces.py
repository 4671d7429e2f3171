"""The traces a profiled run leaves: the merged one keeps each rank's times to the nanosecond (so Perfetto's
nesting rule holds wherever it held on the rank), torch's flow and instant events; each rank's own trace is
saved beside it, with its rank and world size, and readable by torch's and HTA's readers."""

from __future__ import annotations

import json
import os

import pytest

from ppkit import Profile
from ppkit.profiling import merge

BASE_NS = 1790857026000000000  # kineto's base: the wall clock floored to 3 months


def _rank_trace(events, pid=7, base_ns=BASE_NS, extra=()):
    return {"baseTimeNanoseconds": base_ns, "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": f"thread {pid} (python)"}},
        *({"ph": "X", "cat": "cpu_op", "pid": pid, "tid": pid, "name": n, "ts": ts, "dur": dur, "args": {}}
          for n, ts, dur in events), *extra]}


def perfetto_ns(value) -> int:
    """A JSON time in microseconds as Perfetto's importer reads it (json_utils.h CoerceToTs: llround(us * 1000))."""
    return round(value * 1000)


def crossings(events) -> list[tuple[str, str]]:
    """Slices that start inside another on the same thread and end after it (Perfetto: "unnested slice")."""
    out = []
    by_thread: dict = {}
    for e in events:
        if e.get("ph") == "X":
            by_thread.setdefault((e["pid"], e["tid"]), []).append(
                (perfetto_ns(e["ts"]), perfetto_ns(e["ts"]) + perfetto_ns(e["dur"]), e["name"]))
    for slices in by_thread.values():
        slices.sort(key=lambda s: (s[0], -s[1]))
        open_ = []
        for start, end, name in slices:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                out.append((open_[-1][2], name))
            open_.append((start, end, name))
    return out


def test_the_merged_trace_keeps_each_ranks_times_to_the_nanosecond():
    # a child that ends exactly where its parent ends; 0.25 us apart in float64 at 1.8e15 us they did not
    raw = _rank_trace([("parent", 5813149088745.874, 10.0), ("child", 5813149088745.876, 9.998),
                       ("next", 5813149088755.875, 1.001)])
    assert crossings(raw["traceEvents"]) == []
    merged = merge.chrome_trace(merge.merge({0: {"trace": raw}, 1: {"trace": raw}}, {}))
    ops = [e for e in merged["traceEvents"] if e["ph"] == "X"]
    assert crossings(ops) == []
    starts = {(e["pid"], e["name"]): perfetto_ns(e["ts"]) for e in ops}
    assert starts[(0, "parent")] == 0 and starts[(0, "child")] == 2 and starts[(0, "next")] == 10_001
    assert {e["name"]: perfetto_ns(e["dur"]) for e in ops} == {"parent": 10_000, "child": 9_998, "next": 1_001}
    # an offset between machines is taken off in whole nanoseconds too
    shifted = merge.merge({0: {"trace": raw}, 1: {"trace": raw}}, {1: 0.003})
    starts = {(e["rank"], e["name"]): e["start_ns"] for e in shifted.events}
    assert starts[(1, "parent")] == 0 and starts[(1, "child")] == 2 and starts[(0, "child")] == 5


def test_flow_and_instant_events_are_kept_on_their_rank():
    flows = [{"ph": "s", "id": 1, "pid": 7, "tid": 7, "ts": 5813149088745.880, "cat": "fwdbwd", "name": "fwdbwd"},
             {"ph": "f", "id": 1, "pid": 7, "tid": 7, "ts": 5813149088750.0, "cat": "fwdbwd", "name": "fwdbwd",
              "bp": "e"},
             {"ph": "i", "s": "t", "pid": 7, "tid": 7, "ts": 5813149088746.0, "name": "mark"},
             {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 5813149088760.0}]
    raw = _rank_trace([("forward", 5813149088745.874, 2.0), ("backward", 5813149088749.5, 2.0)], extra=flows)
    merged = merge.chrome_trace(merge.merge({0: {"trace": raw}, 1: {"trace": raw}}, {}))
    kept = [e for e in merged["traceEvents"] if e["ph"] in "sfi"]
    assert sorted((e["pid"], e["ph"]) for e in kept) == [(r, ph) for r in (0, 1) for ph in "fiis"]
    ids = {(e["pid"], e["ph"]): e["id"] for e in kept if e["ph"] in "sf"}
    assert ids[(0, "s")] == ids[(0, "f")] != ids[(1, "s")] == ids[(1, "f")]  # one rank's arrow never joins another's
    start = {e["pid"]: perfetto_ns(e["ts"]) for e in kept if e["ph"] == "s"}
    assert start == {0: 6, 1: 6}
    end = [e for e in kept if e["ph"] == "f"][0]
    assert end["bp"] == "e" and end["tid"] == [e for e in merged["traceEvents"] if e.get("name") == "forward"][0]["tid"]


def ddp_step(rank, world_size):
    import torch

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    for _ in range(3):
        model(torch.randn(16, 64)).sum().backward()
    return rank


@pytest.fixture(scope="module")
def recorded(cluster2):
    with cluster2.profile() as prof:
        cluster2.run(ddp_step)
    return prof


@pytest.mark.slow
def test_a_real_runs_merged_trace_nests_as_its_ranks_traces_do_and_keeps_their_flows(recorded, tmp_path):
    merged = json.loads(open(recorded.save(tmp_path / "step.json")).read())["traceEvents"]
    raw = {rank: recorded.trace(rank)["traceEvents"] for rank in recorded.ranks}
    assert all(crossings([e for e in events if e.get("cat") != "Trace"]) == [] for events in raw.values())
    assert crossings(merged) == []
    for rank, events in raw.items():
        for ph in "sfi":
            want = sum(e.get("ph") == ph for e in events)
            assert sum(e["ph"] == ph and e["pid"] == rank for e in merged) == want, (rank, ph)
    assert any(e["ph"] == "s" for e in merged)


@pytest.mark.slow
def test_each_ranks_own_trace_is_saved_beside_the_merged_one_with_its_rank(recorded, tmp_path):
    path = recorded.save(tmp_path / "step.json")
    folder = tmp_path / "step.ranks"
    assert path == str(tmp_path / "step.json") and sorted(os.listdir(folder)) == [
        "rank0.pt.trace.json", "rank1.pt.trace.json"]
    for rank in (0, 1):
        trace = json.loads((folder / f"rank{rank}.pt.trace.json").read_text())
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == 2
        assert trace["distributedInfo"]["backend"] == "gloo"
        assert trace["baseTimeNanoseconds"] == recorded.trace(rank)["baseTimeNanoseconds"]
        assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])
    # what HTA reads of a folder: every file's distributedInfo.rank, each rank once (hta/common/trace_file.py)
    ranks = [json.loads((folder / f).read_text())["distributedInfo"]["rank"] for f in os.listdir(folder)]
    assert sorted(ranks) == [0, 1]
    # torch's own readers of a Chrome trace
    from torch._inductor.analysis.profile_analysis import JsonProfile
    from torch._inductor.fx_passes.profile_guided_estimation import ProfileData

    JsonProfile(str(folder / "rank1.pt.trace.json"))
    data = ProfileData()
    data.load(str(folder / "rank1.pt.trace.json"))
    assert data.pg_configs, "torch reads the process groups from distributedInfo"


@pytest.mark.slow
def test_a_ranks_events_export_its_own_chrome_trace(recorded, tmp_path):
    target = tmp_path / "rank1.json"
    recorded.ranks[1].export_chrome_trace(str(target))
    trace = json.loads(target.read_text())
    assert trace["distributedInfo"]["rank"] == 1
    assert sum(e.get("name") == "aten::addmm" for e in trace["traceEvents"]) == \
        sum(e.get("name") == "aten::addmm" for e in recorded.trace(1)["traceEvents"]) > 0


def test_a_rank_without_a_process_group_still_says_its_rank_and_world_size(tmp_path):
    raw = _rank_trace([("aten::add", 5813149088745.874, 2.0)])
    (tmp_path / "run.ranks").mkdir()
    (tmp_path / "run.ranks" / "rank2.pt.trace.json").write_text("{}")  # a 3-rank run saved there before
    (tmp_path / "run.ranks" / "notes.txt").write_text("mine")
    prof = Profile.from_results([{"trace": raw}, {"trace": json.loads(json.dumps(raw))}])
    prof.save(tmp_path / "run.json")
    assert sorted(os.listdir(tmp_path / "run.ranks")) == ["notes.txt", "rank0.pt.trace.json", "rank1.pt.trace.json"]
    infos = [json.loads((tmp_path / "run.ranks" / f"rank{r}.pt.trace.json").read_text())["distributedInfo"]
             for r in (0, 1)]
    assert infos == [{"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}]
    assert "distributedInfo" not in raw  # what the rank sent is left as it was


def test_a_filtered_or_cut_ranks_event_list_exports_only_the_ops_it_holds(tmp_path):
    """A learner filters a rank's events the way torch's EventList allows, or sorts and cuts it in place: the
    exported trace holds what the list holds (the whole trace only while it holds every op)."""
    names = ["aten::add", "aten::mul", "aten::mm", "aten::relu"]
    raw = _rank_trace([(n, 5813149088745.874 + i, 0.5) for i, n in enumerate(names)])
    prof = Profile.from_results([{"trace": raw}, {"trace": json.loads(json.dumps(raw))}])

    def written(events) -> list[str]:
        events.export_chrome_trace(str(tmp_path / "out.json"))
        trace = json.loads((tmp_path / "out.json").read_text())
        assert trace["distributedInfo"]["rank"] == 0 and trace["traceEvents"][0]["ph"] == "M", trace
        return [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]

    events = prof.ranks[0]
    assert written(events) == names
    assert written(type(events)([e for e in events if e.name == "aten::mm"])) == ["aten::mm"]
    events.sort(key=lambda e: e.name, reverse=True)
    assert sorted(written(events)) == sorted(names)  # every op, in another order: the rank's whole trace
    del events[:3]
    assert written(events) == ["aten::add"]
    with pytest.raises(ValueError, match="Export each rank.s list on its own"):
        type(events)([*prof.ranks[0], *prof.ranks[1]]).export_chrome_trace(str(tmp_path / "both.json"))
