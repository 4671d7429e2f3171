"""ppkit/profiling on a real trace: every rank's recording merged on one clock, classified, summed up,
saved as one Chrome trace, and drawn; cluster.profile() on the module's shared 2-rank cluster."""

from __future__ import annotations

import json
import os
import re

import pytest

import ppkit
from ppkit import ConfigError, Profile, RemoteError
from ppkit.profiling import classify, collect, merge, summary, timeline
from ppkit.profiling.clocks import Offset, measure


def ddp_step(rank, world_size):
    import torch
    import torch.distributed as dist

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    model(torch.randn(16, 64)).sum().backward()
    total = torch.ones(4) * (rank + 1)
    dist.all_reduce(total)
    return total.tolist()


@pytest.fixture(scope="module")
def recorded(cluster2):
    """One profiled DDP step on the shared cluster: the Profile and the job's values."""
    with cluster2.profile(dict(record_shapes=True)) as prof:
        values = cluster2.run(ddp_step)
    return prof, values


@pytest.mark.slow
def test_cluster_profile_records_every_rank_and_keeps_the_run_values(recorded):
    prof, values = recorded
    assert values == [[3.0] * 4, [3.0] * 4]
    assert sorted(prof.ranks) == [0, 1]
    names = {e["name"] for e in prof.events()}
    assert "aten::addmm" in names
    assert {e["rank"] for e in prof.events(kind="communication") if "all_reduce" in e["name"]} == {0, 1}
    # each rank's own torch.profiler result, for those who know it
    assert "aten::addmm" in {row.key for row in prof.ranks[0].key_averages()}


@pytest.mark.slow
def test_the_real_trace_is_classified_by_name(recorded):
    prof, _ = recorded
    kinds = {e["name"]: e["kind"] for e in prof.events()}
    assert kinds["gloo:all_reduce"] == "communication"
    assert kinds["c10d::allreduce_"] == "communication"
    assert kinds["aten::addmm"] == "compute"
    assert kinds["DistributedDataParallel.forward"] == "compute"
    assert classify.kind("aten::broadcast_tensors") == "compute"  # aten's ops compute, whatever their names
    assert classify.kind("prims::broadcast_in_dim") == "compute"  # and prims' (seen in notebook 08's step)
    assert classify.kind("nccl:all_gather") == classify.kind("record_param_comms") == "communication"
    assert classify.kind("c10d::send") == classify.kind("gloo:recv") == "communication"


@pytest.mark.slow
def test_save_writes_one_trace_with_both_ranks_named(recorded, tmp_path):
    prof, _ = recorded
    trace = json.loads(open(prof.save(tmp_path / "step.json")).read())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names) == [0, 1] and names[1].startswith("rank 1")
    ops = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in ops if e["name"].startswith("aten::")} == {0, 1}
    assert {e["pid"] for e in ops if e["name"] == "gloo:all_reduce"} == {0, 1}
    # times count from the first event kept, the profiler's own start mark (an instant event) before any op
    assert min(e["ts"] for e in events if e["ph"] != "M") == 0 and all(e["dur"] >= 0 for e in ops)
    assert any("Input Dims" in e["args"] for e in ops)  # record_shapes was asked for


@pytest.mark.slow
def test_summary_gives_every_rank_its_times(recorded):
    prof, _ = recorded
    table = prof.summary()
    assert [row["rank"] for row in table.rows] == [0, 1]
    for row in table.rows:
        assert row["compute_ms"] > 0 and row["communication_ms"] > 0
        assert 0 <= row["overlapped_ms"] <= min(row["compute_ms"], row["communication_ms"])
        assert row["idle_ms"] >= 0
        assert row["span_ms"] == pytest.approx(
            row["compute_ms"] + row["communication_ms"] - row["overlapped_ms"] + row["idle_ms"])
        assert row["top_ops"] and all(ms >= 0 for _, ms in row["top_ops"])
    assert "<table" in table._repr_html_() and "overlapped" in table._repr_html_()
    assert "rank" in repr(table).splitlines()[0]
    assert table[1]["rank"] == 1


@pytest.mark.slow
def test_the_timeline_names_both_ranks_and_loads_nothing_from_the_network(recorded):
    prof, _ = recorded
    page = prof.timeline().html()
    rows = [json.dumps(f"rank {r} · main")[1:-1] for r in (0, 1)]  # as plotly writes them in the page
    assert all(row in page for row in rows)
    assert re.findall(r"<(?:script|link|img)[^>]*(?:src|href)\s*=\s*['\"]?https?://", page) == []
    fig = prof.timeline().figure
    assert {trace.name for trace in fig.data} == {"compute", "communication"}
    hover = [row for trace in fig.data for row in trace.customdata if row[0] == "aten::addmm"][0]
    assert hover[1].endswith("µs") and hover[2].startswith("shapes [[")


@pytest.mark.slow
def test_a_job_that_fails_in_the_block_raises_and_ends_the_recording(cluster2):
    def fails(rank, world_size):
        raise ValueError("on purpose")

    with pytest.raises(RemoteError), cluster2.profile():
        cluster2.run(fails)
    with cluster2.profile() as prof:  # the ranks' profilers were stopped: a new block starts
        cluster2.run(lambda rank, world_size: None)
    assert sorted(prof.ranks) == [0, 1]


def _one_rank_raises(rank, world_size):
    import time

    import torch

    torch.mm(torch.ones(8, 8), torch.ones(8, 8))
    if rank == 1:
        time.sleep(0.5)  # the other ranks have returned by then
        raise ValueError("on purpose")


def test_a_block_that_fails_keeps_what_every_rank_recorded(cluster2, tmp_path):
    with pytest.raises(RemoteError, match="on purpose"), cluster2.profile() as prof:
        cluster2.run(_one_rank_raises)
    assert sorted(prof.ranks) == [0, 1] and prof.missing == {}, prof  # each rank's profiler ran to the end
    assert all(any(e.name == "aten::mm" for e in prof.ranks[r]) for r in (0, 1))
    prof.save(tmp_path / "failed.json")
    assert sorted(os.listdir(tmp_path / "failed.ranks")) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]


def _raises_while_rank_0_waits(rank, world_size):
    import torch
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("on purpose")
    dist.all_reduce(torch.ones(2))


def test_a_block_whose_failure_leaves_ranks_blocked_says_why_no_trace_is_kept(fresh, tmp_path):
    with pytest.raises(RemoteError, match="on purpose"), fresh.profile() as prof:
        fresh.run(_raises_while_rank_0_waits, timeout=20)
    assert len(prof.ranks) == 0 and list(prof.missing) == [0, 1], prof
    assert "could not be collected" in prof.missing[0] and "still blocked" in prof.missing[0], prof.missing
    with pytest.raises(ConfigError, match=r"holds no rank's trace.*no trace from ranks \[0, 1\]"):
        prof.save(tmp_path / "blocked.json")
    fresh.restart()


def test_a_spawn_whose_rank_raises_keeps_the_other_ranks_traces_and_says_which_is_missing(tmp_path):
    with pytest.raises(ppkit.WorkerError, match="on purpose") as raised:
        ppkit.spawn(_one_rank_raises, args=(2,), nprocs=3, profile=True)
    prof = raised.value.profile
    assert sorted(prof.ranks) == [0, 2] and list(prof.missing) == [1], prof
    assert "it raised ValueError" in prof.missing[1] and "rank 1 has none" in "".join(raised.value.__notes__)
    assert "no trace from rank 1: it raised ValueError" in repr(prof)
    merged = json.loads(open(prof.save(tmp_path / "run.json")).read())
    assert list(merged["ppkitMissingRanks"]) == ["1"]
    assert (tmp_path / "run.ranks" / "missing.txt").read_text().startswith("rank 1: it raised ValueError")
    with pytest.raises(ConfigError, match="holds no rank's trace.*no trace from rank 0: it raised"):
        Profile(missing={0: "it raised ValueError"}).save(tmp_path / "empty.json")


def test_clock_offsets_are_measured_as_ntp_does():
    # a rank whose clock runs 5 s ahead: found within half the round trip
    import time

    def run(fn, timeout):
        return [time.time_ns() + 5_000_000_000, time.time_ns()]

    offsets = measure(run, pings=3)
    assert offsets[0].offset_us == pytest.approx(5e6, abs=offsets[0].error_us + 1)
    assert offsets[1].offset_us == pytest.approx(0, abs=offsets[1].error_us + 1)


def _trace(events, base_ns=0):
    return {"baseTimeNanoseconds": base_ns, "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "thread 7 (python)"}},
        *({"ph": "X", "cat": "cpu_op", "pid": 7, "tid": 7, "name": n, "ts": ts, "dur": dur, "args": {}}
          for n, ts, dur in events)]}


def test_merge_takes_a_remote_ranks_offset_off_its_times():
    # rank 1 ran on a machine whose clock is 2 s ahead: its all_reduce lands on rank 0's
    results = {0: {"trace": _trace([("gloo:all_reduce", 1000.0, 50.0)], base_ns=10**15), "host": "a"},
               1: {"trace": _trace([("gloo:all_reduce", 1010.0, 40.0)], base_ns=10**15 + 2 * 10**9), "host": "b"}}
    offsets = {0: Offset(0.0, 10.0), 1: Offset(2e6, 10.0)}
    prof = Profile(results, offsets, here="a")
    starts = {e["rank"]: e["start_us"] for e in prof.events()}
    assert starts == {0: 0.0, 1: 10.0}
    unaligned = merge.merge(results, {})
    assert {e["rank"]: e["start_us"] for e in unaligned.events}[1] == 2e6 + 10.0
    assert unaligned.threads[(0, 7)] == "main"


def test_summary_counts_nested_ops_once_and_overlap_as_the_intersection():
    events = [{"name": n, "rank": 0, "tid": t, "start_us": s, "dur_us": d, "kind": classify.kind(n), "args": {},
               "cat": "user_annotation" if n.startswith("gloo") else "cpu_op"}
              for n, t, s, d in [("aten::linear", 1, 0.0, 100.0), ("aten::addmm", 1, 10.0, 80.0),
                                 ("gloo:all_reduce", 2, 60.0, 100.0), ("aten::add", 1, 200.0, 50.0)]]
    row = summary.Summary(events).rows[0]
    assert row["compute_ms"] == pytest.approx(0.150)
    assert row["communication_ms"] == pytest.approx(0.100)
    assert row["overlapped_ms"] == pytest.approx(0.040)
    assert row["span_ms"] == pytest.approx(0.250) and row["idle_ms"] == pytest.approx(0.040)
    assert dict(row["top_ops"]) == pytest.approx({"gloo:all_reduce": 0.1, "aten::addmm": 0.08, "aten::add": 0.05,
                                                  "aten::linear": 0.02})
    assert row["overlap_pct"] == pytest.approx(40.0)


def test_the_timeline_inlines_plotly_once_per_kernel():
    results = {0: {"trace": _trace([("aten::mm", 0.0, 5.0)]), "host": "a"}}
    prof = Profile(results, here="a")
    timeline._shown_js[0] = False
    first, second = prof._repr_html_(), prof._repr_html_()
    assert "window.Plotly" in first and len(first) > 1_000_000  # plotly.js itself
    assert len(second) < 100_000 and "Plotly.newPlot" in second


def test_bytes_of_an_op_come_from_its_message_or_its_input_shapes():
    from ppkit.profiling import sizes

    assert sizes.op_bytes({"In msg nelems": 10, "dtype": "Float"}) == 40
    assert sizes.op_bytes({"Input Dims": [[16, 64], []], "Input type": ["float", "Scalar"]}) == 16 * 64 * 4
    assert sizes.op_bytes({}) is None


def test_profile_options_are_checked():
    assert collect.request(True) == collect.Request()
    assert collect.request(False) is None and collect.request(None) is None
    assert collect.request({"with_stack": 1}) == collect.Request(with_stack=True)
    with pytest.raises(ConfigError, match="record_shape"):
        collect.request({"record_shape": True})
    with pytest.raises(ConfigError, match="True, False or a dict"):
        collect.request("yes")
    with pytest.raises(ConfigError, match="no rank 5"):
        Profile({}).events(rank=5)
    with pytest.raises(ConfigError, match="kind must be"):
        Profile({}).events(kind="idle")


def test_the_magics_read_profile_flags():
    from ppkit.cluster import session
    from ppkit.cluster.torchrun import options

    assert options.parse(["--nproc-per-node", "2", "--profile"], cell=True).profile == collect.Request()
    assert options.parse(["--nproc-per-node", "2", "--profile-shapes"], cell=True).profile == collect.Request(
        record_shapes=True)
    assert options.parse(["--nproc-per-node", "2"], cell=True).profile is None
    assert session.parse_line("--timeout 5 --profile") == {"timeout": 5.0, "profile": True}
    assert session.parse_line("--profile-shapes") == {"profile": {"record_shapes": True}}
    with pytest.raises(ConfigError, match=r"\[--profile\]"):
        session.parse_line("--profil")


def test_spawn_refuses_profile_without_join_before_starting_anything():
    import ppkit

    with pytest.raises(ConfigError, match="profile=True needs join=True"):
        ppkit.spawn(lambda i: None, nprocs=2, join=False, profile=True)
    with pytest.raises(ConfigError, match="profile must be True, False or a dict"):
        ppkit.torchrun(lambda: None, nproc_per_node=2, profile="on")


# -- issue 46: what counts as compute, sizes, clocks, GPU streams ----------------------------------------------
def synchronous_steps(rank, world_size, labelled):
    """Six steps of a matmul then a blocking all_reduce; with ``labelled``, every other step inside a learner's
    ``record_function`` span. Nothing overlaps: the all_reduce waits for the matmul and the next waits for it."""
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.profiler import record_function

    x = torch.randn(192, 192)
    for step in range(6):
        with record_function("my_step") if labelled and step % 2 else contextlib.nullcontext():
            y = x @ x
            dist.all_reduce(y)


@pytest.mark.slow
def test_a_blocking_all_reduce_inside_a_learners_span_is_not_overlapped(cluster2):
    rows = {}
    for labelled in (False, True):
        with cluster2.profile() as prof:
            cluster2.run(synchronous_steps, labelled)
        rows[labelled] = prof.summary().rows
        assert any(e["name"] == "my_step" for e in prof.events()) == labelled
    for labelled, ranks in rows.items():
        for row in ranks:
            assert row["communication_ms"] > 0 and row["compute_ms"] > 0
            # a blocking collective hides behind nothing, label or no label (before: 30-46 % with the label)
            assert row["overlap_pct"] < 5, (labelled, row)


def _events(rows):
    """Synthetic merged events of rank 0: (name, tid, start_us, dur_us, cat)."""
    return [{"name": n, "rank": 0, "tid": t, "start_us": s, "dur_us": d, "kind": classify.kind(n), "cat": c,
             "args": {}} for n, t, s, d, c in rows]


@pytest.mark.parametrize("span, cat", [
    ("my_step", "user_annotation"), ("DistributedDataParallel.forward", "user_annotation"),
    ("ProfilerStep#3", "user_annotation"), ("train.py(12): step", "python_function"),  # with_stack's frames
    ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "cpu_op")])
def test_a_span_around_a_blocking_collective_is_not_compute(span, cat):
    events = _events([(span, 1, 0.0, 300.0, cat), ("aten::mm", 1, 10.0, 90.0, "cpu_op"),
                      ("c10d::allreduce_", 1, 100.0, 5.0, "cpu_op"),  # launches it, then the thread waits
                      ("gloo:all_reduce", 2, 104.0, 190.0, "user_annotation")])
    row = summary.Summary(events).rows[0]
    assert row["compute_ms"] == pytest.approx(0.090)  # the matmul only: the span is no work of its own
    assert row["overlapped_ms"] == 0 and row["overlap_pct"] == 0
    assert row["span_ms"] == pytest.approx(0.300) and row["idle_ms"] == pytest.approx(0.300 - 0.090 - 0.194)


def test_compute_beside_an_asynchronous_collective_is_overlap():
    # DDP: a bucket's all-reduce launched from an AccumulateGrad hook runs on gloo's thread while the next
    # layer's backward computes on the main thread: AddmmBackward0's own time and aten::mm's count, the
    # hook's evaluate_function (around the launch) and the step's label do not
    events = _events([("ProfilerStep#1", 1, 0.0, 400.0, "user_annotation"),
                      ("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 1, 0.0, 50.0,
                       "cpu_op"), ("aten::add_", 1, 5.0, 20.0, "cpu_op"),
                      ("c10d::allreduce_", 1, 30.0, 10.0, "cpu_op"), ("aten::empty", 1, 32.0, 2.0, "cpu_op"),
                      ("autograd::engine::evaluate_function: AddmmBackward0", 1, 60.0, 200.0, "cpu_op"),
                      ("AddmmBackward0", 1, 60.0, 200.0, "cpu_op"), ("aten::mm", 1, 70.0, 150.0, "cpu_op"),
                      ("gloo:all_reduce", 2, 40.0, 100.0, "user_annotation"),
                      ("aten::copy_", 2, 50.0, 10.0, "cpu_op")])  # gloo's own copy: communication's work
    row = summary.Summary(events).rows[0]
    assert row["compute_ms"] == pytest.approx((20 + 200) / 1000)  # add_, then AddmmBackward0 and its mm
    assert row["communication_ms"] == pytest.approx((10 + 100) / 1000)
    assert row["overlapped_ms"] == pytest.approx((140 - 60) / 1000)  # gloo's all_reduce under the backward


def collectives_of_every_size(rank, world_size):
    import torch
    import torch.distributed as dist

    for dtype in (torch.bfloat16, torch.float64, torch.int64, torch.float16):
        dist.all_reduce(torch.ones(1000, dtype=dtype))


def _hovers(prof, name):
    return [row for trace in prof.timeline().figure.data for row in trace.customdata if row[0] == name]


@pytest.mark.slow
def test_every_collectives_hover_names_its_size_in_bytes_for_its_dtype(cluster2):
    with cluster2.profile() as prof:  # by default: before, only profile=dict(record_shapes=True) had sizes
        cluster2.run(collectives_of_every_size)
    for rank in (0, 1):
        gloo = sorted((e for e in prof.events(rank=rank) if e["name"] == "gloo:all_reduce"),
                      key=lambda e: e["start_us"])  # in the order they ran, over gloo's two threads
        assert [e["bytes"] for e in gloo] == [2000, 8000, 8000, 2000]  # bf16, float64, int64, fp16
        c10d = [e for e in prof.events(rank=rank) if e["name"] == "c10d::allreduce_"]
        assert [e["elements"] for e in c10d] == [1000] * 4  # a TensorList: its dtype is not recorded
    assert sorted(row[3] for row in _hovers(prof, "gloo:all_reduce")) == sorted(
        ["2,000 bytes"] * 4 + ["8,000 bytes"] * 4)
    assert {row[3] for row in _hovers(prof, "c10d::allreduce_")} == {"1,000 elements"}
    with cluster2.profile(dict(record_shapes=False)) as plain:  # shapes turned off: the hover says so
        cluster2.run(collectives_of_every_size)
    assert {e["bytes"] for e in plain.events(kind="communication")} == {None}
    assert {row[3] for row in _hovers(plain, "gloo:all_reduce")} == {
        "size not in the trace (recorded unless profile=dict(record_shapes=False))"}
    barrier = {"name": "gloo:barrier", "kind": "communication", "args": {}, "bytes": None, "elements": None}
    assert timeline.size_text(barrier) == "no data: a barrier"  # gloo's barrier takes no tensor


def test_item_sizes_cover_every_dtype_name_the_profiler_writes(tmp_path):
    # both vocabularies: the profiler's "Input type" (C++ type names: "c10::BFloat16", "long int") and the
    # ScalarType names of record_param_comms' "dtype" ("BFloat16", "Long"), checked against torch itself
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    from ppkit.profiling import sizes

    dtypes = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "ComplexHalf support is experimental", quantized dtypes' deprecation
        tensors = {dtype: torch.empty(3, dtype=dtype) for dtype in dtypes}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for tensor in tensors.values():
            torch.ops.aten.alias(tensor)
    prof.export_chrome_trace(str(tmp_path / "dtypes.json"))
    ops = [e["args"] for e in json.loads((tmp_path / "dtypes.json").read_text())["traceEvents"]
           if e.get("name") == "aten::alias"]
    assert len(ops) == len(dtypes)
    for dtype, args in zip(tensors, ops):
        assert sizes.op_bytes(args) == 3 * dtype.itemsize, (dtype, args["Input type"])
    for dtype, tensor in tensors.items():
        scalar_type = tensor.type().rsplit(".", 1)[-1].removesuffix("Tensor")  # torch.BFloat16Tensor: BFloat16
        assert sizes.op_bytes({"In msg nelems": 10, "dtype": scalar_type}) == 10 * dtype.itemsize, dtype
    assert sizes.op_bytes({"In msg nelems": 1000, "dtype": "BFloat16"}) == 2000
    assert sizes.op_bytes({"In msg nelems": 1000, "dtype": "Long"}) == 8000
    assert sizes.op_bytes({"In msg nelems": 10, "dtype": "SomeFutureType"}) is None  # no guess


def test_each_ranks_clock_is_known_within_its_own_bound():
    # one ping reaches every rank: rank 0 answers at the start of one ping's window and at the end of the next,
    # rank 1 always in the middle. Rank 0's clock is pinned down closely; rank 1's is not, and each offset is
    # within its own bound (before: both got the fastest ping's whole half round trip as their bound)
    import time

    true_offsets_ns = {0: 3_000_000_000, 1: -7_000_000_000}
    window_s = 0.02
    pings = []

    def run(fn, timeout):
        start = time.time_ns()
        time.sleep(window_s / 2)
        middle = time.time_ns()
        time.sleep(window_s / 2)
        end = time.time_ns()
        answer = start if len(pings) % 2 == 0 else end
        pings.append(None)
        return [answer + true_offsets_ns[0], middle + true_offsets_ns[1]]

    offsets = measure(run, pings=4)
    for rank, true_ns in true_offsets_ns.items():
        assert abs(offsets[rank].offset_us - true_ns / 1000) <= offsets[rank].error_us + 1, (rank, offsets)
    assert offsets[1].error_us >= window_s / 2 * 1e6 * 0.9  # the middle of a 20 ms window: +-10 ms
    assert offsets[0].error_us < offsets[1].error_us / 4


def test_an_offset_within_its_bound_is_not_applied():
    # rank 1 is on another machine, but its measured offset (300 µs) is smaller than its bound (500 µs): noise,
    # not a clock difference, so its times stay as recorded. A 2 s offset known to 10 µs is taken off.
    def results(base_1):
        return {0: {"trace": _trace([("gloo:all_reduce", 1000.0, 50.0)], base_ns=10**15), "host": "a"},
                1: {"trace": _trace([("gloo:all_reduce", 1010.0, 40.0)], base_ns=base_1), "host": "b"}}

    noise = Profile(results(10**15), {0: Offset(0.0, 500.0), 1: Offset(300.0, 500.0)}, here="a")
    assert {e["rank"]: e["start_us"] for e in noise.events()} == {0: 0.0, 1: 10.0}
    assert noise.applied_offsets == {}
    real = Profile(results(10**15 + 2 * 10**9), {0: Offset(0.0, 10.0), 1: Offset(2e6, 10.0)}, here="a")
    assert {e["rank"]: e["start_us"] for e in real.events()} == {0: 0.0, 1: 10.0}
    assert real.applied_offsets == {1: 2e6}


def test_a_clock_that_steps_between_pings_falls_back_to_the_tightest_ping():
    # rank 0's clock jumps 1 s forward after the first ping: no offset fits both pings, so the ping with the
    # shortest round trip (the second, with no sleep) gives the offset and half its round trip the bound
    import time

    pings = []

    def run(fn, timeout):
        if not pings:
            time.sleep(0.01)
        pings.append(None)
        return [time.time_ns() + (len(pings) - 1) * 1_000_000_000]

    offset = measure(run, pings=2)[0]
    assert offset.offset_us == pytest.approx(1e6, abs=offset.error_us + 1)
    assert offset.error_us < 5_000  # the fast ping's half round trip, not the slow one's


def _gpu_trace():
    """A rank's trace with CUDA activity, shaped as torch's kineto writes it: the CPU thread (pid = the process)
    launches; the kernels run on the GPU (pid = the device, tid = the stream), NCCL's on a stream of its own."""
    cpu, gpu = 4242, 0

    def op(name, cat, pid, tid, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    return {"baseTimeNanoseconds": 10**15, "traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": cpu, "tid": cpu, "args": {"name": "thread 4242 (python)"}},
        {"ph": "M", "name": "process_name", "pid": gpu, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": gpu, "tid": 7, "args": {"name": "stream 7 "}},
        {"ph": "M", "name": "thread_name", "pid": gpu, "tid": 20, "args": {"name": "stream 20 "}},
        op("ProfilerStep#1", "user_annotation", cpu, cpu, 0.0, 1000.0),
        op("aten::mm", "cpu_op", cpu, cpu, 10.0, 20.0), op("cudaLaunchKernel", "cuda_runtime", cpu, cpu, 12.0, 5.0),
        op("c10d::allreduce_", "cpu_op", cpu, cpu, 40.0, 30.0),
        op("record_param_comms", "cpu_op", cpu, cpu, 42.0, 25.0, **{"In msg nelems": 1000, "dtype": "BFloat16"}),
        op("cudaLaunchKernel", "cuda_runtime", cpu, cpu, 50.0, 5.0),
        op("cudaStreamSynchronize", "cuda_runtime", cpu, cpu, 100.0, 850.0),  # the CPU waits: no compute
        op("ProfilerStep#1", "gpu_user_annotation", gpu, 7, 20.0, 900.0, device=0, stream=7),
        op("ampere_sgemm_128x64_tn", "kernel", gpu, 7, 20.0, 400.0, device=0, stream=7),
        op("Memcpy DtoD (Device -> Device)", "gpu_memcpy", gpu, 7, 430.0, 10.0, device=0, stream=7),
        op("ampere_sgemm_128x64_tn", "kernel", gpu, 7, 500.0, 100.0, device=0, stream=7),
        op("nccl:all_reduce", "gpu_user_annotation", gpu, 20, 300.0, 180.0, device=0, stream=20),
        op("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", gpu, 20,
           300.0, 180.0, device=0, stream=20),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "pid": cpu, "tid": cpu, "ts": 12.0}]}


def test_on_a_gpu_the_overlap_is_gpu_time_compute_kernels_against_nccl_kernels():
    prof = Profile({0: {"trace": _gpu_trace(), "host": "a"}}, here="a")
    kinds = {e["name"]: e["kind"] for e in prof.events() if e["cat"] == "kernel"}
    assert kinds == {"ampere_sgemm_128x64_tn": "compute",
                     "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)":
                         "communication"}
    row = prof.summary()[0]
    assert row["measured_on"] == "GPU"
    assert row["compute_ms"] == pytest.approx(0.500)  # the sgemm kernels, not the CPU's launches or its wait
    assert row["communication_ms"] == pytest.approx(0.180)  # NCCL's kernel
    assert row["overlapped_ms"] == pytest.approx(0.120)  # [300, 420] of it beside the first sgemm
    assert row["span_ms"] == pytest.approx(0.580) and row["idle_ms"] == pytest.approx(0.020)  # [480, 500]
    assert row["top_ops"][0] == ("ampere_sgemm_128x64_tn", pytest.approx(0.5))
    assert "GPU" in repr(prof.summary()) and "GPU" in prof.summary()._repr_html_()


def test_the_timeline_shows_each_ranks_gpu_streams_below_its_cpu_threads():
    prof = Profile({0: {"trace": _gpu_trace(), "host": "a"}, 1: {"trace": _gpu_trace(), "host": "a"}}, here="a")
    fig = prof.timeline().figure
    rows = list(reversed(fig.layout.yaxis.categoryarray))  # top to bottom
    assert rows == ["rank 0 · main", "rank 0 · cuda:0 stream 7", "rank 0 · cuda:0 stream 20",
                    "rank 1 · main", "rank 1 · cuda:0 stream 7", "rank 1 · cuda:0 stream 20"]
    nccl = [e for e in prof.events(rank=0, kind="communication") if e["cat"] == "kernel"]
    assert [prof.thread_name(0, e["tid"]) for e in nccl] == ["cuda:0 stream 20"]
    assert {e["bytes"] for e in prof.events(rank=0) if e["name"] == "record_param_comms"} == {2000}


def matmul_on_the_gpu(i):
    import torch

    x = torch.randn(256, 256, device="cuda")
    (x @ x).sum().item()


@pytest.mark.slow
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_a_rank_with_cuda_records_its_kernels_on_stream_rows():
    import ppkit

    prof = ppkit.spawn(matmul_on_the_gpu, nprocs=1, profile=True)
    kernels = [e for e in prof.events(rank=0) if e["cat"] == "kernel"]
    assert kernels and all(prof.thread_name(0, e["tid"]).startswith("cuda:") for e in kernels)
    assert prof.summary()[0]["measured_on"] == "CPU"  # no NCCL kernel: the CPU's time, not the GPU's


# -- issue 46's review: async backend spans, functional waits, nested profilers, clocks, labels -----------------
def p2p_beside_matmuls(rank, world_size):
    """Ring attention's and pipeline P2P's pattern: an isend/irecv in flight while ten matmuls run."""
    import torch
    import torch.distributed as dist

    x, buf = torch.randn(256, 256), torch.randn(1 << 20)
    for _ in range(3):
        work = dist.isend(buf, 1) if rank == 0 else dist.irecv(buf, 0)
        for _ in range(10):
            x @ x
        work.wait()


@pytest.mark.slow
def test_compute_while_a_send_or_recv_is_in_flight_counts_and_overlaps(cluster2):
    with cluster2.profile() as prof:
        cluster2.run(p2p_beside_matmuls)
    for rank in (0, 1):
        row = prof.summary()[rank]
        matmuls = sum(e["dur_us"] for e in prof.events(rank=rank) if e["name"] == "aten::mm") / 1000
        # gloo's gloo:send / gloo:recv runs on the calling thread from isend to wait(): before, every matmul
        # under it was thrown away (compute 0.07 ms of 185 ms of aten::mm, overlap 0 %)
        assert row["compute_ms"] >= 0.99 * matmuls, (row, matmuls)
        assert row["overlap_pct"] > 0, row


def _p2p_events():
    # the calling thread: c10d::send starts gloo:send, which ends at wait(); the matmul runs between
    return _events([("my_step", 1, 0.0, 400.0, "user_annotation"), ("c10d::send", 1, 0.0, 10.0, "cpu_op"),
                    ("gloo:send", 1, 5.0, 300.0, "user_annotation"), ("aten::mm", 1, 20.0, 200.0, "cpu_op"),
                    ("aten::add", 1, 320.0, 20.0, "cpu_op"),
                    ("gloo:all_reduce", 2, 320.0, 50.0, "user_annotation"),  # a worker thread's call frame:
                    ("aten::copy_", 2, 330.0, 10.0, "cpu_op")])  # its copy is communication's work


def test_a_backend_span_on_the_calling_thread_does_not_swallow_its_ops():
    row = summary.Summary(_p2p_events()).rows[0]
    assert row["compute_ms"] == pytest.approx((200 + 20) / 1000)  # mm and add; not gloo's copy
    assert row["overlapped_ms"] == pytest.approx((200 + 20) / 1000)
    assert row["communication_ms"] == pytest.approx((305 + 50) / 1000)  # c10d::send and gloo:send, gloo:all_reduce


def test_the_lessons_breakdown_counts_compute_under_a_send_in_flight():
    from ppkit.lessons import overlap_trace

    events = _events([(overlap_trace.STEP, 1, 0.0, 400.0, "user_annotation")]) + _p2p_events()[1:]
    out = overlap_trace.breakdown(events, 0)
    assert out["compute"] == pytest.approx((200 + 20) / 1000)
    assert out["overlapped"] == pytest.approx((200 + 20) / 1000)


@pytest.mark.parametrize("name", ["_c10d_functional::wait_tensor", "c10d::wait", "_c10d_functional::all_reduce"])
def test_a_functional_collectives_wait_is_communication(name):
    assert classify.kind(name, "cpu_op") == classify.COMMUNICATION


def blocking_functional_all_reduce(rank, world_size):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    x, buf = torch.randn(256, 256), torch.randn(1 << 20)
    for _ in range(4):
        x @ x
        z = funcol.all_reduce(buf, "sum", dist.group.WORLD)
        z + 1  # waits here: nothing runs beside the all_reduce


@pytest.mark.slow
def test_a_blocking_functional_all_reduce_is_not_hidden(cluster2):
    with cluster2.profile() as prof:
        cluster2.run(blocking_functional_all_reduce)
    for row in prof.summary().rows:
        assert row["overlap_pct"] < 10, row  # before: 70 % and 65 %, wait_tensor's wait counted as compute


def a_profiler_of_its_own(i):
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]):
        torch.randn(64, 64) @ torch.randn(64, 64)


@pytest.mark.slow
def test_a_learners_own_profiler_inside_profile_true_is_refused_by_name():
    import ppkit

    # before: each rank died of SIGSEGV in kineto ("Cancelling current trace request...")
    with pytest.raises(RemoteError, match=r"(?s)ConfigError.*already records this rank.*profile=True"):
        ppkit.spawn(a_profiler_of_its_own, nprocs=2, profile=True)
    ppkit.spawn(a_profiler_of_its_own, nprocs=2)  # without ppkit's, the learner's own profiler runs


def test_ranks_that_share_a_clock_get_one_offset(monkeypatch):
    base = 10**15 + 450_000  # the clock of machine b is 450 us ahead of the kernel's
    results = {0: {"trace": _trace([("gloo:all_reduce", 1000.0, 50.0)], 10**15), "host": "a", "clock": "A"},
               1: {"trace": _trace([("gloo:all_reduce", 1000.0, 50.0)], base), "host": "b1", "clock": "B"},
               2: {"trace": _trace([("gloo:all_reduce", 1000.0, 50.0)], base), "host": "b2", "clock": "B"}}
    prof = Profile(results, {0: Offset(0, 10), 1: Offset(460, 400), 2: Offset(390, 400)}, here="A")
    # each rank's own offset exceeds its bound (460 > 400) or not (390 < 400): before, rank 1 was moved by
    # 460 us and rank 2 not at all, pulling apart two ranks that read one clock. Intersected: [60, 790]
    assert prof.applied_offsets == {1: pytest.approx(425.0), 2: pytest.approx(425.0)}
    starts = {e["rank"]: e["start_us"] for e in prof.events()}
    assert starts[1] == starts[2]
    near = Profile(results, {0: Offset(0, 10), 1: Offset(460, 470), 2: Offset(390, 400)}, here="A")
    assert near.applied_offsets == {}  # [-10, 790]: 390 +- 400 is noise, for both ranks
    assert len({e["start_us"] for e in near.events()}) == 2


def test_a_rank_reports_its_machines_clock():
    with open("/proc/sys/kernel/random/boot_id") as file:
        assert collect.clock_id() == file.read().strip()


def test_a_stray_kernel_does_not_hide_gloos_collectives():
    # a rank on a GPU whose collectives go through gloo: a kernel, but no NCCL kernel
    trace = {"baseTimeNanoseconds": 10**15, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 42, "tid": 42, "ts": 0.0, "dur": 20.0, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 10.0, "dur": 100.0,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 42, "tid": 42, "ts": 30.0, "dur": 10.0,
         "args": {}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 42, "tid": 99, "ts": 40.0,
         "dur": 500.0, "args": {}}]}
    row = Profile({0: {"trace": trace, "host": "a"}}, here="a").summary()[0]
    assert row["measured_on"] == "CPU"  # before: GPU, and gloo's 0.5 ms of communication dropped (0 ms)
    assert row["communication_ms"] == pytest.approx(0.510)


@pytest.mark.parametrize("name, cat, want", [
    ("fsdp::all_gather_copy_in", "cpu_op", classify.COMPUTE),  # FSDP2 packs its shards: a copy
    ("FSDP::all_gather_copy_out", "user_annotation", classify.COMPUTE),
    ("FSDP::all_gather (layers.0)", "user_annotation", classify.COMPUTE),  # a label: its ops say
    ("my all_reduce step", "user_annotation", classify.COMPUTE),
    ("gloo:all_gather", "user_annotation", classify.COMMUNICATION),
    ("nccl:all_reduce", "user_annotation", classify.COMMUNICATION),
    ("c10d::allgather_into_tensor_coalesced", "cpu_op", classify.COMMUNICATION)])
def test_labels_and_packing_copies_are_not_communication_by_name(name, cat, want):
    assert classify.kind(name, cat) == want
