"""ppkit.log_metrics on ranks and ppkit.metrics in the kernel (issue 48, item 4): what a call checks, how a
rank batches its messages, the records a run gives back under Cluster.run, ppkit.spawn and ppkit.torchrun,
and the plot drawn from them. The live plot in a real kernel: test_torchrun_output.py; in a browser:
browser/test_metrics_in_lab.py."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tracemalloc
import warnings

import pytest
import torch

import ppkit
from ppkit.cluster.output import metrics_board, metrics_plot
from ppkit.cluster.output.metrics_board import MetricsBoard
from ppkit.transport import metrics as rank_metrics


@pytest.fixture(scope="module")
def cluster():
    with ppkit.Cluster(2) as c:
        yield c


# -- the call --------------------------------------------------------------------------------------
@pytest.mark.parametrize("step, values, says", [
    (True, {"loss": 1.0}, "step must be a whole number"),
    (-1, {"loss": 1.0}, "step must be a whole number"),
    (1.5, {"loss": 1.0}, "step must be a whole number"),
    (0, {}, "no metric"),
    (0, {"rank": 1.0}, "'rank' is a column every record has"),
    (0, {"time": 1.0}, "'time' is a column every record has"),
    (0, {"loss": "low"}, "loss='low' is text, not a number"),
    (0, {"loss": None}, "loss=None is not a number"),
    (0, {"loss": torch.ones(2)}, "is not a number"),
    (0, {"loss": "4.5"}, "loss='4.5' is text, not a number"),  # float() took it before
    (0, {"loss": 10**400}, "loss=1000.* is too large for a float"),  # OverflowError before
])
def test_a_call_that_cannot_be_recorded_says_what_to_write(step, values, says):
    with pytest.raises(ppkit.ConfigError, match=says):
        ppkit.log_metrics(step=step, **values)


def test_outside_a_ppkit_rank_the_process_keeps_what_it_logged():
    """A script under plain torchrun: nothing to send, ppkit.metrics() there gives its own values, by its RANK."""
    code = ("import ppkit, torch\n"
            "for i in range(3): ppkit.log_metrics(loss=1.0 / (i + 1), mem=torch.tensor(7))\n"
            "ppkit.log_metrics(step=10, loss=0.0)\n"
            "print([(r['rank'], r['step'], r['loss'], r.get('mem')) for r in ppkit.metrics()])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RANK": "3", "PPKIT_PRESTART": "0"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("[(3, 0, 1.0, 7.0), (3, 1, 0.5, 7.0), (3, 2, 0.3333333333333333, 7.0), "
                                   "(3, 10, 0.0, None)]")


def test_a_rank_sends_once_per_interval_not_once_per_step(monkeypatch):
    """1000 calls within one interval send once (the first call: nothing was sent for a while); flush sends
    the rest; nothing is lost or reordered."""
    sent, sent_by_call = [], []
    saved = (rank_metrics._log.send, rank_metrics._log.pending, rank_metrics._log.sent_at, rank_metrics._log.job)
    try:
        rank_metrics.attach(sent.append)
        rank_metrics.start_job(1)
        clock = [1000.0]
        monkeypatch.setattr(rank_metrics.time, "time", lambda: clock[0])
        for i in range(1000):
            before = len(sent)
            rank_metrics.log_metrics(step=i, loss=float(i), tokens_per_s=2.0 * i)
            sent_by_call += [i] if len(sent) > before else []
            clock[0] += 0.0001  # a step of 0.1 ms: 0.1 s in all, under one interval
        assert sent_by_call == [0]
        clock[0] += rank_metrics.SEND_EVERY_S
        before = len(sent)
        rank_metrics.log_metrics(step=1000, loss=1000.0, tokens_per_s=2000.0)
        assert len(sent) > before  # 2000 values: in messages of at most VALUES_PER_MESSAGE
        before = len(sent)
        rank_metrics.flush()
        assert len(sent) == before  # nothing left: no empty message
        rows = rank_metrics.records({0: [s for msg in sent for s in msg.series]})
        assert [r["step"] for r in rows] == list(range(1001))
        assert all(r["loss"] == r["step"] and r["tokens_per_s"] == 2 * r["step"] for r in rows)
    finally:
        rank_metrics._log.send, rank_metrics._log.pending, rank_metrics._log.sent_at, rank_metrics._log.job = saved


# -- a run's records -------------------------------------------------------------------------------
def _train(rank, world_size, steps=30):
    import time

    import ppkit

    for i in range(steps):
        ppkit.log_metrics(step=i, loss=1.0 / (i + 1) + rank, memory_mb=100.0 + rank)
        time.sleep(0.005)
    return rank


def test_cluster_run_gives_every_rank_and_step_back_as_records(cluster):
    assert cluster.run(_train) == [0, 1]
    rows = ppkit.metrics()
    assert len(rows) == 60
    assert {(r["rank"], r["step"]) for r in rows} == {(rank, i) for rank in (0, 1) for i in range(30)}
    for row in rows:
        assert row["loss"] == pytest.approx(1.0 / (row["step"] + 1) + row["rank"])
        assert row["memory_mb"] == 100.0 + row["rank"] and row["time"] > 0
    assert rows == sorted(rows, key=lambda r: (r["step"], r["rank"]))


def test_a_run_that_logs_nothing_leaves_the_last_records_and_each_run_starts_empty(cluster):
    cluster.run(_train, 5)
    cluster.run(lambda rank, world_size: None)
    assert sorted({r["step"] for r in ppkit.metrics()}) == list(range(5))  # the last run that logged


def _forks_a_child_that_logs(rank, world_size):
    import multiprocessing
    import time

    import ppkit

    def child():  # a DataLoader worker, say: forked by the rank, with the rank's state
        time.sleep(0.3)  # past the send interval: its call would send
        ppkit.log_metrics(step=0, from_the_child=1.0)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join()
    ppkit.log_metrics(step=0, loss=float(rank))
    return process.exitcode


def test_a_process_the_rank_forks_keeps_its_metrics_off_the_ranks_channel(cluster):
    """Without the check the child wrote its message on the rank's own connection to the kernel."""
    assert cluster.run(_forks_a_child_that_logs) == [0, 0]
    assert [(r["rank"], r["loss"], "from_the_child" in r) for r in ppkit.metrics()] == [(0, 0.0, False),
                                                                                      (1, 1.0, False)]


def test_a_frame_without_pandas_says_how_to_get_one():
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ppkit.ConfigError, match="pip install pandas"):
            ppkit.metrics(frame=True)
    else:
        frame = ppkit.metrics(frame=True)
        assert list(frame.columns[:3]) == ["rank", "step", "time"]


def _logs_without_step(rank, world_size):
    import ppkit

    for i in range(3):
        ppkit.log_metrics(loss=float(i))


def test_a_run_without_step_counts_from_zero_each_run(cluster):
    """Before: the second run went on from the first's count (steps 3, 4, 5)."""
    for _ in range(2):
        cluster.run(_logs_without_step)
        assert sorted((r["rank"], r["step"]) for r in ppkit.metrics()) == [(r, s) for r in (0, 1) for s in range(3)]


def _leaves_a_thread_that_logs(rank, world_size):
    import threading
    import time

    import ppkit

    def stray():  # a learner's background thread that outlives its run
        for _ in range(300):
            ppkit.log_metrics(step=0, stray=1.0)
            time.sleep(0.005)

    threading.Thread(target=stray, daemon=True).start()


def _logs_for_a_while(rank, world_size):
    import time

    import ppkit

    for step in range(40):
        ppkit.log_metrics(step=step, loss=float(step))
        time.sleep(0.01)


def test_a_thread_an_earlier_run_left_running_reports_nothing_into_the_next(cluster):
    """Before: the next run's records (and plot) had the earlier run's thread's 'stray' metric."""
    cluster.run(_leaves_a_thread_that_logs)
    cluster.run(_logs_for_a_while)
    rows = ppkit.metrics()
    assert {name for row in rows for name in row} == {"rank", "step", "time", "loss"}
    assert len(rows) == 80


def test_a_message_of_another_job_is_not_drawn_or_kept():
    board = MetricsBoard()
    with board.job(7):
        board.add(0, _message(6, "late", [0], [1.0]))
        board.add(0, _message(7, "loss", [0], [2.0]))
        assert [(r["step"], r.get("loss"), "late" in r) for r in board.records()] == [(0, 2.0, False)]
        assert board.summary() == "step 0: loss 2"


def _fails_after_logging(rank, world_size, fail_at):
    import ppkit

    for step in range(5):
        if step == fail_at:
            raise ValueError(f"rank {rank} fails at step {step}")
        ppkit.log_metrics(step=step, loss=float(step))


def test_a_failed_run_s_values_reach_the_kernel_and_a_rerun_failing_first_leaves_none(cluster):
    """The values a rank logged up to its error are kept (its last step too); a re-run that fails before its
    first log_metrics leaves no values of the run before (before the fix: the earlier run's 10 rows)."""
    with pytest.raises(ppkit.WorkerError, match="fails at step 4"):
        cluster.run(_fails_after_logging, 4)
    assert sorted((r["rank"], r["step"]) for r in ppkit.metrics()) == [(r, s) for r in (0, 1) for s in range(4)]
    with pytest.raises(ppkit.WorkerError, match="fails at step 0"):
        cluster.run(_fails_after_logging, 0)
    assert ppkit.metrics() == []


def _asks_for_metrics(rank, world_size):
    import ppkit

    ppkit.log_metrics(step=0, loss=1.0)
    return ppkit.metrics()


def test_metrics_on_a_ppkit_rank_says_the_values_went_to_the_kernel(cluster):
    """Before: it returned only the values not sent yet (the first call sends at once: here none)."""
    with pytest.raises(ppkit.WorkerError, match="went to the kernel"):
        cluster.run(_asks_for_metrics)


def _logs_a_tensor_that_needs_grad(rank, world_size):
    import warnings

    import torch

    import ppkit

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ppkit.log_metrics(step=0, loss=(torch.ones((), requires_grad=True) * 2))


def test_a_tensor_that_needs_grad_is_logged_without_a_warning(cluster):
    """Before: float() of it warned (here, as an error: 'Converting a tensor with requires_grad=True')."""
    cluster.run(_logs_a_tensor_that_needs_grad)
    assert [r["loss"] for r in ppkit.metrics()] == [2.0, 2.0]


def test_a_child_forked_while_another_thread_holds_the_log_lock_can_log():
    """Before: the child inherited the held lock and hung in log_metrics (killed after 20 s here)."""
    code = ("import os, threading, time, ppkit\n"
            "from ppkit.transport import metrics\n"
            "metrics.attach(lambda msg: None); metrics.start_job(1)\n"
            "held = threading.Event()\n"
            "def hold():\n"
            "    with metrics._log.lock:\n"
            "        held.set(); time.sleep(3)\n"
            "threading.Thread(target=hold, daemon=True).start(); held.wait()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    ppkit.log_metrics(step=0, loss=1.0)\n"
            "    print('child', ppkit.metrics()[0]['loss'], flush=True); os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PPKIT_PRESTART": "0"})
    assert done.returncode == 0 and done.stdout.strip() == "child 1.0", (done.stdout, done.stderr)


def test_a_large_flush_goes_in_messages_under_16_kib():
    """A cancel lands between two writes of the channel: a message of one write cannot be cut by it."""
    sent = []
    saved = (rank_metrics._log.send, rank_metrics._log.pending, rank_metrics._log.sent_at, rank_metrics._log.job)
    try:
        rank_metrics.attach(sent.append)
        rank_metrics.start_job(1)
        rank_metrics._log.sent_at = 1e18  # nothing goes until flush
        for i in range(2000):
            rank_metrics.log_metrics(step=i, loss=i * 0.37, tokens_per_s=1e6 + i)
        rank_metrics.flush()
    finally:
        rank_metrics._log.send, rank_metrics._log.pending, rank_metrics._log.sent_at, rank_metrics._log.job = saved
    assert len(sent) >= 8 and max(len(pickle.dumps(msg)) for msg in sent) < 16 * 1024
    rows = rank_metrics.records({0: [s for msg in sent for s in msg.series]})
    assert [(r["step"], r["tokens_per_s"]) for r in rows] == [(i, 1e6 + i) for i in range(2000)]


def _spawned(i, steps):
    import ppkit

    for step in range(steps):
        ppkit.log_metrics(step=step, loss=float(i * 100 + step))


def test_spawn_and_torchrun_send_their_last_values_before_their_processes_end():
    ppkit.spawn(_spawned, args=(7,), nprocs=2)
    assert sorted((r["rank"], r["step"], r["loss"]) for r in ppkit.metrics()) == [
        (i, s, float(i * 100 + s)) for i in (0, 1) for s in range(7)]

    def main():
        import os

        import ppkit

        for step in range(5):  # the first call sends at once; the other four wait for the next interval
            ppkit.log_metrics(step=step, loss=float(os.environ["RANK"]))
        os._exit(0)  # a script's abrupt end: what it logged still reaches the kernel

    ppkit.torchrun(main, nproc_per_node=2)
    assert sorted((r["rank"], r["step"], r["loss"]) for r in ppkit.metrics()) == [
        (r, s, float(r)) for r in (0, 1) for s in range(5)]


# -- the kernel's side ------------------------------------------------------------------------------
def _message(job_id, name, steps, values, start=0.0):
    return rank_metrics.Metrics(job_id, (rank_metrics.MetricSeries(
        name, tuple(steps), tuple(start + i * 1e-5 for i in range(len(steps))), tuple(values)),))


def test_the_plot_draws_a_line_per_rank_in_a_panel_per_metric():
    board = MetricsBoard()
    with board.job(1):
        board.add(0, _message(1, "loss", (0, 1, 2), (3.0, 2.0, float("nan"))))
        board.add(1, rank_metrics.Metrics(1, (rank_metrics.MetricSeries("loss", (0, 1), (1.0, 2.0), (4.0, 2.5)),
                                              rank_metrics.MetricSeries("<mfu>", (1,), (2.0,), (0.3,)))))
        assert board.summary() == "step 2: loss 2.5 (rank 0: nan), <mfu> 0.3"
    assert [(r["rank"], r["step"], r.get("<mfu>")) for r in board.records()] == [
        (0, 0, None), (1, 0, None), (0, 1, None), (1, 1, 0.3), (0, 2, None)]
    trace = metrics_plot.Trace.of
    svg = metrics_plot.svg({"loss": {0: trace([0, 1, 2], [3.0, 2.0, float("nan")]), 1: trace([0, 1], [4.0, 2.5])},
                            "<mfu>": {1: trace([1], [0.3])}})
    assert svg.count('class="ppkit-metric"') == 2 and 'data-name="&lt;mfu&gt;"' in svg  # a name is escaped
    assert svg.count('data-rank="0"') == 1 and svg.count('data-rank="1"') == 2
    loss_rank0 = svg.split('data-rank="0"')[1].split("/>")[0]
    assert len(loss_rank0.split(' points="')[1].split('"')[0].split()) == 2  # the NaN is left out of the line


def _polylines(svg):
    return [part.split('"')[0].split() for part in svg.split(' points="')[1:]]


def test_a_long_line_keeps_its_spike_and_its_last_point():
    steps = list(range(10_000))
    values = [1.0] * 10_000
    values[5_003] = 50.0
    for trace in (metrics_plot.Trace.of(steps, values), _extended(steps, values)):
        points = _polylines(metrics_plot.svg({"loss": {0: trace}}))[0]
        svg = metrics_plot.svg({"loss": {0: trace}})
        assert len(points) <= 2 * metrics_plot.MAX_BUCKETS + 1
        assert f"{metrics_plot.TOP}" in {p.split(",")[1] for p in points}  # the spike is drawn, at the top
        assert points[-1].split(",")[0] == f"{metrics_plot.RIGHT}" and ">step 9999<" in svg  # the line ends there


def _extended(steps, values, chunk=700):
    trace = metrics_plot.Trace()
    for i in range(0, len(steps), chunk):
        trace.extend(steps[i:i + chunk], values[i:i + chunk])
    return trace


def test_twenty_metrics_of_eight_ranks_draw_a_small_image_of_whole_pixels():
    """Before: 698 KiB (every 13th of 5000 points a line, one decimal each); the front end parses every frame."""
    lines = {f"metric_{k}": {r: metrics_plot.Trace.of(range(5000), [float(i % 97) + r for i in range(5000)])
                             for r in range(8)} for k in range(20)}
    svg = metrics_plot.svg(lines)
    assert len(svg) < 256 * 1024, len(svg)  # 214 KiB: at most one point a pixel a line
    assert all("." not in point for line in _polylines(svg) for point in line)


def test_a_long_name_and_eight_ranks_keep_title_and_legend_apart():
    """Before: both on y=12, the legend drawn over the title."""
    name = "tokens_per_second_per_device_after_warmup_including_io"
    svg = metrics_plot.svg({name: {r: metrics_plot.Trace.of([0, 1], [1.0, 2.0]) for r in range(8)}})
    title = svg.split('class="ppkit-title"')[0].rsplit("<text", 1)[1]
    legend = svg.split('class="ppkit-legend"')[0].rsplit("<text", 1)[1]
    assert title.split('y="')[1].split('"')[0] != legend.split('y="')[1].split('"')[0]
    shown = svg.split('class="ppkit-title">')[1].split("</text>")[0].split("</title>")[1]
    assert len(shown) <= metrics_plot.TITLE_CHARS and shown.endswith("…") and f"<title>{name}</title>" in svg


def test_the_kernel_keeps_a_long_run_compactly_and_draws_a_bounded_copy():
    """100 000 steps of 3 metrics in messages of 500 values, as a rank sends them. Before: every value kept
    twice in lists of float objects (about 90 bytes a value, and one dict per step built at the run's end)."""
    board = MetricsBoard()
    n, per = 100_000, 500
    tracemalloc.start()
    try:
        with board.job(3):
            for first in range(0, n, per):
                steps = range(first, first + per)
                for name in ("loss", "tokens_per_s", "mfu"):
                    board.add(0, _message(3, name, steps, [s * 0.5 for s in steps], start=1.7e9), now=0.0)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 3 * n * 30, held / (3 * n)  # 24 bytes a value, and the bounded drawing copy
    assert len(board.records()) == n and board.records()[-1] == {
        "rank": 0, "step": n - 1, "time": pytest.approx(1.7e9 + (per - 1) * 1e-5), "loss": (n - 1) * 0.5,
        "tokens_per_s": (n - 1) * 0.5, "mfu": (n - 1) * 0.5}


def test_a_run_past_the_cap_warns_and_goes_on_drawing(monkeypatch):
    monkeypatch.setattr(metrics_board, "MAX_KEPT", 1000)
    board = MetricsBoard()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with board.job(1):
            for first in range(0, 3000, 500):
                board.add(0, _message(1, "loss", range(first, first + 500), [1.0] * 500), now=0.0)
    assert len(caught) == 1 and "keeps a run's first 1,000 values" in str(caught[0].message)
    assert len(board.records()) == 1000 and board.summary() == "step 2999: loss 1"
