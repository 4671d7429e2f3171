"""Each rank's output on its way to the cell, without processes: identical lines collapsed in each
rank's order, ``\\r`` lines drawn in place on a terminal, what torchrun's output options hide and keep,
output beyond the inbox's limit kept in a file, and the torchrun options that steer where ranks meet."""

from __future__ import annotations

import types

import pytest

import ppkit
from ppkit.cluster.inbox import Inbox, Item
from ppkit.cluster.output import OutputSettings, RankPrinter
from ppkit.cluster.output.collapse import Collapser
from ppkit.cluster.output.settings import rank_ranges
from ppkit.cluster.torchrun import options
from ppkit.transport.messages import Output


def add_all(collapser, rank, lines, now):
    for line in lines:
        collapser.add(rank, "stdout", line, now)


def test_identical_lines_leave_once_with_every_rank_and_each_ranks_order_is_kept():
    c = Collapser([0, 1])
    add_all(c, 0, ["epoch 1", "rank 0 says", "epoch 2"], 0.0)
    assert c.ready(0.0) == []  # rank 1 may still print epoch 1
    add_all(c, 1, ["epoch 1", "rank 1 says", "epoch 2"], 0.1)
    assert c.ready(0.1) == [("stdout", "epoch 1", [0, 1]), ("stdout", "rank 0 says", [0]),
                            ("stdout", "rank 1 says", [1]), ("stdout", "epoch 2", [0, 1])]


def test_a_line_waits_at_most_the_window_and_crossed_lines_never_deadlock():
    c = Collapser([0, 1], window_s=0.5)
    add_all(c, 0, ["X", "Y"], 0.0)
    add_all(c, 1, ["Y", "X"], 0.0)
    assert c.ready(0.4) == []
    assert c.ready(0.5) == [("stdout", "X", [0]), ("stdout", "Y", [0, 1]), ("stdout", "X", [1])]
    c.add(0, "stdout", "only rank 0", 1.0)
    assert c.ready(1.2) == [] and c.ready(1.5) == [("stdout", "only rank 0", [0])]


def test_through_and_flush_hand_back_every_line_in_order():
    c = Collapser([0, 1, 2])
    add_all(c, 0, ["a", "b"], 0.0)
    c.add(1, "stdout", "a", 0.0)
    assert c.through(0) == [("stdout", "a", [0, 1]), ("stdout", "b", [0])]
    c.add(2, "stderr", "late", 0.0)
    assert c.flush() == [("stderr", "late", [2])]


def test_rank_ranges_and_labels():
    assert rank_ranges([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8"
    plain = OutputSettings()
    assert plain.label([2]) == "[rank 2] " and plain.label([0, 1, 2]) == "[ranks 0-2] "
    assert plain.label([1], ["worker-b", "worker-a"]) == "[worker-a] "
    templated = OutputSettings(prefix="[${role_name}${local_rank}]:", role="trainer", nproc_per_node=2)
    assert templated.label([3]) == "[trainer1]:"


def test_a_redrawn_line_is_drawn_in_place_on_a_terminal_and_ends_once(capsys):
    printer = RankPrinter(world_size=2)
    with printer.use(OutputSettings(collapse=True, live=True)):
        printer.write(0, "stderr", "\r  0%|   | 0/4")
        printer.write(0, "stderr", "\r 50%|#  | 2/4\r100%|###| 4/4\n")
        printer.write(1, "stdout", "done\n")
    out = capsys.readouterr()
    assert out.err == "\r[rank 0]   0%|   | 0/4\r[rank 0] 100%|###| 4/4\n", out.err
    assert out.out == "[rank 1] done\n"


def test_plain_output_is_as_before_and_a_run_hides_and_prefixes_what_it_asks(capsys):
    printer = RankPrinter(world_size=2)
    printer.write(0, "stdout", "a\nb")
    printer.write(1, "stdout", "c\n")
    printer.flush()
    assert capsys.readouterr().out == "[rank 0] a\n[rank 1] c\n[rank 0] b\n"
    hidden = frozenset({(1, "stdout"), (1, "stderr")})
    with printer.use(OutputSettings(hidden=hidden, prefix="<${rank}> ")):
        printer.write(1, "stdout", "not shown\n")
        printer.write(0, "stdout", "shown\n")
    assert capsys.readouterr().out == "<0> shown\n"


def test_output_beyond_the_limit_goes_to_a_file_named_in_the_cell(capsys):
    printer = RankPrinter(world_size=1)
    inbox = Inbox(lambda item: printer.write(item.source, item.msg.stream, item.msg.text) or True,
                  max_output_chars=10, output=printer)
    inbox.put(Item(0, Output("stdout", "first\n"), 0))
    inbox.put(Item(0, Output("stdout", "far too long for the queue\n"), 0))
    assert inbox.next(None) is None
    out = capsys.readouterr()
    assert "[rank 0] first\n" in out.out
    note = out.err.split(" but in ")[1].split(": it printed")[0]
    assert "27 characters of this rank's output are not shown here" in out.err
    assert open(note).read() == "far too long for the queue\n"


def parse(line: str):
    return options.parse(line.split(), cell=True)


def test_torchruns_output_options_say_what_each_rank_shows_and_keeps():
    launch = parse("--nproc-per-node 2 --tee 0:3 --redirects 1:1 --local-ranks-filter 1")
    out = launch.output
    assert out.logged == {(0, "stdout"), (0, "stderr"), (1, "stdout")}
    assert out.hidden == {(0, "stdout"), (0, "stderr"), (1, "stdout")}  # 0 filtered out, 1's stdout redirected
    assert out.collapse and out.live and not parse("--no-collapse").output.collapse
    assert parse("--nproc-per-node 2 --log-dir /tmp/x").output.logged == {
        (r, s) for r in (0, 1) for s in ("stdout", "stderr")}  # --log-dir alone keeps both streams


def test_rendezvous_options_say_where_the_store_is_and_notes_name_what_changes_nothing():
    launch = parse("--rdzv-backend c10d --rdzv-endpoint localhost:29411 --monitor-interval 5")
    assert (launch.master_addr, launch.master_port) == ("localhost", 29411)
    assert launch.notes == ("[ppkit] --monitor-interval 5.0 changes nothing here: ppkit learns of a rank's exit "
                            "when it happens, with nothing to poll.",)
    assert parse("--rdzv-endpoint 10.0.0.1").master_port == 29400  # torchrun's default rendezvous port
    assert parse("--master-addr 127.0.0.2 --master-port 29501").master_addr == "127.0.0.2"
    assert "not used with --standalone" in parse("--standalone --rdzv-endpoint h:1").notes[0]
    assert options.parse(["-m", "pkg.train", "--lr", "3"], cell=False).module


def test_nproc_per_node_auto_is_the_gpus_else_the_cpu_budget_never_more_than_the_cores(monkeypatch):
    import torch

    from ppkit.cluster import budget

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(budget, "read_budget", lambda: types.SimpleNamespace(cores=1.5))
    assert options.nproc_per_node("auto") == 1
    monkeypatch.setattr(budget, "read_budget", lambda: types.SimpleNamespace(cores=10_000))
    assert options.nproc_per_node("auto") == options.nproc_per_node("cpu")  # the cores this kernel may use
    with pytest.raises(ppkit.ConfigError, match="--nproc-per-node gpu: this machine has no GPU"):
        options.nproc_per_node("gpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert options.nproc_per_node("auto") == options.nproc_per_node("gpu") == 4
