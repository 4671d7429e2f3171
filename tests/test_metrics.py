"""ppkit.log_metrics on ranks and ppkit.metrics in the kernel (issue 48, item 4): what a call checks, how a
rank batches its messages, the records a run gives back under Cluster.run, ppkit.spawn and ppkit.torchrun,
and the plot drawn from them. The live plot in a real kernel: test_torchrun_output.py; in a browser:
browser/test_rank_output_in_lab.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ppkit
from ppkit.cluster.output import metrics_plot
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
    (0, {"loss": "low"}, "loss='low' is not a number"),
    (0, {"loss": torch.ones(2)}, "is not a number"),
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


def test_a_rank_sends_one_message_per_interval_not_one_per_step(monkeypatch):
    """1000 calls within one interval are one message; flush sends the rest; nothing is lost or reordered."""
    sent = []
    saved = (rank_metrics._log.send, rank_metrics._log.pending, rank_metrics._log.sent_at, rank_metrics._log.pid)
    try:
        rank_metrics.attach(sent.append)
        clock = [1000.0]
        monkeypatch.setattr(rank_metrics.time, "time", lambda: clock[0])
        for i in range(1000):
            rank_metrics.log_metrics(step=i, loss=float(i), tokens_per_s=2.0 * i)
            clock[0] += 0.0001  # a step of 0.1 ms: 0.1 s in all, under one interval
        assert len(sent) == 1  # the first call sends (nothing was sent for a while), the rest wait
        clock[0] += rank_metrics.SEND_EVERY_S
        rank_metrics.log_metrics(step=1000, loss=1000.0, tokens_per_s=2000.0)
        assert len(sent) == 2
        rank_metrics.flush()
        rank_metrics.flush()  # nothing left: no empty message
        assert len(sent) == 2
        rows = rank_metrics.records({0: [s for msg in sent for s in msg.series]})
        assert [r["step"] for r in rows] == list(range(1001))
        assert all(r["loss"] == r["step"] and r["tokens_per_s"] == 2 * r["step"] for r in rows)
    finally:
        rank_metrics._log.send, rank_metrics._log.pending, rank_metrics._log.sent_at, rank_metrics._log.pid = saved


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

        ppkit.log_metrics(step=0, loss=float(os.environ["RANK"]))
        os._exit(0)  # a script's abrupt end: what it logged still reaches the kernel

    ppkit.torchrun(main, nproc_per_node=2)
    assert [(r["rank"], r["loss"]) for r in ppkit.metrics()] == [(0, 0.0), (1, 1.0)]


# -- the plot ---------------------------------------------------------------------------------------
def test_the_plot_draws_a_line_per_rank_in_a_panel_per_metric():
    board = MetricsBoard()
    with board.job():
        board.add(0, rank_metrics.Metrics((rank_metrics.MetricSeries("loss", (0, 1, 2), (1.0, 2.0, 3.0),
                                                                    (3.0, 2.0, float("nan"))),)))
        board.add(1, rank_metrics.Metrics((rank_metrics.MetricSeries("loss", (0, 1), (1.0, 2.0), (4.0, 2.5)),
                                           rank_metrics.MetricSeries("<mfu>", (1,), (2.0,), (0.3,)))))
        assert board.summary() == "step 2: loss 2.5 (rank 0: nan), <mfu> 0.3"
    assert [(r["rank"], r["step"], r.get("<mfu>")) for r in board.records()] == [
        (0, 0, None), (1, 0, None), (0, 1, None), (1, 1, 0.3), (0, 2, None)]
    svg = metrics_plot.svg({"loss": {0: ([0, 1, 2], [3.0, 2.0, float("nan")]), 1: ([0, 1], [4.0, 2.5])},
                            "<mfu>": {1: ([1], [0.3])}})
    assert svg.count('class="ppkit-metric"') == 2 and 'data-name="&lt;mfu&gt;"' in svg  # a name is escaped
    assert svg.count('data-rank="0"') == 1 and svg.count('data-rank="1"') == 2
    loss_rank0 = svg.split('data-rank="0"')[1].split("/>")[0]
    assert len(loss_rank0.split(' points="')[1].split('"')[0].split()) == 2  # the NaN is left out of the line


def test_a_long_line_is_thinned_to_at_most_max_points_keeping_the_last():
    steps = list(range(10_000))
    svg = metrics_plot.svg({"loss": {0: (steps, [float(s) for s in steps])}})
    points = svg.split(' points="')[1].split('"')[0].split()
    assert len(points) <= metrics_plot.MAX_POINTS and points[-1].startswith(f"{metrics_plot.WIDTH - 8}.0,")


class _Counted(list):
    """A line's steps or values that counts what the plot reads of them."""

    read = 0

    def __getitem__(self, index):
        _Counted.read += 1
        return super().__getitem__(index)

    def __iter__(self):
        _Counted.read += len(self)
        return super().__iter__()


def test_a_redraw_reads_only_the_points_it_draws_however_long_the_run():
    """The kernel redraws twice a second while ranks train: a redraw that read every value logged so far cost
    444 ms at 100 000 steps on this VM (2 ms now), time taken from the ranks on the same cores."""
    n = 100_000
    lines = {"loss": {r: (_Counted(range(n)), _Counted(float(s) for s in range(n))) for r in (0, 1)}}
    _Counted.read = 0
    metrics_plot.svg(lines)
    assert _Counted.read <= 2 * 2 * (metrics_plot.MAX_POINTS + 1), _Counted.read
