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
    add_all(c, 0, ["epoch 1", "ada says", "epoch 2"], 0.0)
    assert c.ready(0.0) == []  # rank 1 may still print epoch 1
    add_all(c, 1, ["epoch 1", "bob says", "epoch 2"], 0.1)
    assert c.ready(0.1) == [("stdout", "epoch 1", [0, 1]), ("stdout", "ada says", [0]),
                            ("stdout", "bob says", [1]), ("stdout", "epoch 2", [0, 1])]


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


def test_a_message_between_ranks_lines_leaves_another_ranks_half_written_line_whole(capsys):
    """A rank stopped at a breakpoint, or the hang watch, prints its message while another rank is halfway through
    a line (print's pieces reach the pipe apart under load): that line is not cut in two around the message (the
    2026-11-29 CI run showed "[rank 0] after the breakpoint" and "[rank 0]  40" apart). The stopped rank's own
    half line comes before its prompt."""
    printer = RankPrinter(world_size=2)
    with printer.use(OutputSettings(collapse=True)):
        printer.write(0, "stdout", "after the breakpoint")
        printer.write(1, "stdout", "about to stop: ")
        printer.interject(1)
        print("[ppkit] rank 1 stopped")
        printer.write(0, "stdout", " 40\n")
    assert capsys.readouterr().out == ("[rank 1] about to stop: \n[ppkit] rank 1 stopped\n"
                                       "[rank 0] after the breakpoint 40\n")
    with printer.use(OutputSettings(collapse=False)):  # the two ranks' lines of one shape stay apart too
        printer.write(0, "stdout", "after the breakpoint")
        printer.interject(1)
        printer.write(1, "stdout", "after the breakpoint 41\n")
        printer.write(0, "stdout", " 40\n")
    assert capsys.readouterr().out == "[rank 1] after the breakpoint 41\n[rank 0] after the breakpoint 40\n"


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


# -- lines that differ only in their numbers (issue 47, item 3)

def lines_of(ranks_and_texts, stream="stdout"):
    c = Collapser(sorted(ranks_and_texts))
    for rank, text in ranks_and_texts.items():
        c.add(rank, stream, text, 0.0)
    return c.ready(0.0) + c.flush()


def test_lines_that_differ_only_in_numbers_fold_into_the_spread_naming_the_rank_that_stands_out():
    losses = {0: "2.31", 1: "2.33", 2: "2.35", 3: "2.32", 4: "2.34", 5: "2.91", 6: "2.31", 7: "2.33"}
    folded = lines_of({rank: f"step 10 loss {loss}" for rank, loss in losses.items()})
    assert folded == [("stdout", "step 10 loss 2.31…2.35 (rank 5: 2.91)", list(range(8)))]
    assert OutputSettings().label(folded[0][2]) + folded[0][1] == "[ranks 0-7] step 10 loss 2.31…2.35 (rank 5: 2.91)"
    # an even spread names no rank; values too far apart to be one quantity up to noise (1.0 to 3.0) are said of
    # the ranks of each; a value that differs on every rank (two ranks that differ) is each rank's own
    assert lines_of({0: "loss 2.31", 1: "loss 2.33", 2: "loss 2.35", 3: "loss 2.31"})[0][1] == "loss 2.31…2.35"
    wide = lines_of({0: "loss 1.0", 1: "loss 2.0", 2: "loss 3.0", 3: "loss 1.0"})
    assert [(text, ranks) for _, text, ranks in wide] == [("loss 1.0", [0, 3]), ("loss 2.0", [1]), ("loss 3.0", [2])]
    assert lines_of({0: "loss 2.31", 1: "loss 9.99"}) == [("stdout", "loss 2.31", [0]), ("stdout", "loss 9.99", [1])]


def test_lines_that_differ_in_words_stay_apart():
    apart = [("loss 2.31", "loss nan"), ("took 1.2s", "took 1.2ms"), ("on worker3", "on worker4"),
             ("torch 2.14.1", "torch 2.15.1"), ("at 0x7f3a", "at 0x7f3b"), ("on 10.0.0.1", "on 10.0.0.2"),
             ("rank 0 sends", "rank 1 waits")]
    for a, b in apart:
        assert len(lines_of({0: a, 1: b, 2: a})) == 2, (a, b)


def test_the_folding_rule_reads_signs_exponents_ints_floats_percentages_and_durations():
    from ppkit.cluster.output.fold import fold

    def f(*texts):  # lines of one step (each rank's first "step 7"): a rank that stands out may be named
        folded = [(ranks, text.removeprefix("step 7 ")) for ranks, text in fold(
            [(rank, f"step 7 {text}") for rank, text in enumerate(texts)], first=True)]
        return folded[0][1] if len(folded) == 1 else folded

    assert f("delta -0.5", "delta -0.45", "delta -0.48", "delta -0.5") == "delta -0.5…-0.45"
    # across zero no spread is one quantity up to noise: the ranks of each value are said
    assert f("delta -0.5", "delta +0.25", "delta 0.1", "delta -0.5") == \
        [([0, 3], "delta -0.5"), ([1], "delta +0.25"), ([2], "delta 0.1")]
    assert f("lr 1e-3", "lr 1e-3", "lr 1e-3", "lr 2.5E-2") == "lr 1e-3 (rank 3: 2.5E-2)"
    assert f("tokens 100.5", "tokens 100.5", "tokens 99.5", "tokens 101.5") == "tokens 99.5…101.5"
    assert f("acc 91.5%", "acc 93.0%", "acc 92.0%", "acc 92.0%") == "acc 91.5%…93.0%"
    assert len(f("acc 91%", "acc 93%", "acc 92%", "acc 92%")) == 3  # a whole percentage: a progress, never spread
    assert f("step took 1.2s", "step took 1.3s", "step took 1.25s", "step took 1.2s", "step took 4.0s") == \
        "step took 1.2s…1.3s (rank 4: 4.0s)"
    assert f("x 1", "x 1.0") == [([0], "x 1"), ([1], "x 1.0")]  # a number is shown as the rank wrote it
    assert f("at 04:17:50", "at 04:17:51", "at 04:17:50") == [([0, 2], "at 04:17:50"), ([1], "at 04:17:51")]
    assert f("3 of 4 ranks", "3 of 4 ranks") == "3 of 4 ranks"
    # several ranks off the same majority are each named, and only the numbers that differ are spread
    assert f(*[f"epoch 2 grad {g} lr 0.1" for g in ("1.5", "1.5", "1.5", "1.5", "7.5", "1.5", "9.5", "1.5")]) == \
        "epoch 2 grad 1.5 (rank 4: 7.5, rank 6: 9.5) lr 0.1"


def test_the_outlier_rule_is_a_robust_one():
    from ppkit.cluster.output.fold import resolution, standing_out

    assert [resolution(n) for n in ("2.31", "12", "2.5E-2", "-1e-9", ".5", "+0.250")] == \
        pytest.approx([0.01, 1, 0.001, 1e-9, 0.1, 0.001])

    assert standing_out([2.31, 2.33, 2.35, 2.91]) == [3]  # far from the median, in median absolute deviations
    assert standing_out([1.0, 2.0, 3.0, 4.0]) == [] and standing_out([1.0, 5.0]) == []
    # the others agree exactly: a difference stands out when it is more than one step of the written precision
    assert standing_out([1.0, 1.0, 1.0, 1.01], resolution=0.01) == []
    assert standing_out([1.0, 1.0, 1.0, 1.02], resolution=0.01) == [3]
    # and when the odd ones are at most a quarter of the values: 3 of 8 is an uneven split, 2 of 8 are named
    assert standing_out([13.0] * 5 + [10.0] * 3, resolution=1) == []
    assert standing_out([13.0] * 6 + [10.0] * 2, resolution=1) == [6, 7]
    assert standing_out([1.0, 1.0, 2.0, 2.0]) == []  # no majority
    assert standing_out([1.0, 1.0, float("inf")]) == []  # nothing to measure against


def test_ordinary_differences_between_ranks_name_no_rank_and_a_real_outlier_is_named():
    from ppkit.cluster.output.fold import fold

    def f(texts):  # lines of one step (each rank's first "step 7"): a rank that stands out may be named
        folded = [(ranks, text.removeprefix("step 7 ")) for ranks, text in fold(
            [(rank, f"step 7 {text}") for rank, text in enumerate(texts)], first=True)]
        return folded[0][1] if len(folded) == 1 else folded

    # DistributedSampler's uneven split: 3 ranks of 8 one sample short, said of the ranks that have each count
    assert f([f"rank has {n} samples" for n in (13, 13, 13, 13, 13, 12, 12, 12)]) == \
        [([0, 1, 2, 3, 4], "rank has 13 samples"), ([5, 6, 7], "rank has 12 samples")]
    # one step of the precision the ranks wrote (a clock's tick, rounding, float noise) names no rank: the
    # ranks of each value are said
    assert f(["took 1.2s"] * 3 + ["took 1.3s"] + ["took 1.2s"] * 4) == \
        [([0, 1, 2, 4, 5, 6, 7], "took 1.2s"), ([3], "took 1.3s")]
    assert f(["loss 2.3100"] * 3 + ["loss 2.3101"] * 3 + ["loss 2.3102"] * 2) == "loss 2.3100…2.3102"
    # across zero no relative tolerance holds: the ranks of each value are said (nothing named, nothing spread)
    assert f(["grad norm -1e-9"] + ["grad norm 0"] * 6 + ["grad norm 1e-9"]) == \
        [([0], "grad norm -1e-9"), ([1, 2, 3, 4, 5, 6], "grad norm 0"), ([7], "grad norm 1e-9")]
    # a real outlier: at 8 ranks, and at 4 whether the others agree exactly or not
    assert f(["loss 2.31"] * 5 + ["loss 2.91"] + ["loss 2.31"] * 2) == "loss 2.31 (rank 5: 2.91)"
    assert f(["loss 2.31", "loss 2.31", "loss 2.91", "loss 2.31"]) == "loss 2.31 (rank 2: 2.91)"
    assert f(["loss 2.31", "loss 2.33", "loss 2.35", "loss 2.33", "loss 2.91"]) == "loss 2.31…2.35 (rank 4: 2.91)"
    # four values that all differ read as they would with two alike (review 52b F1): 2.31 to 2.35 are one
    # quantity up to noise, 2.91 stands out
    assert f(["loss 2.31", "loss 2.33", "loss 2.35", "loss 2.91"]) == "loss 2.31…2.35 (rank 3: 2.91)"
    assert f(["loss 2.31", "loss 2.33", "loss 2.33", "loss 2.91"]) == "loss 2.31…2.33 (rank 3: 2.91)"


def test_ansi_colours_stay_whole_and_numbers_inside_them_fold():
    red, green, end = "\x1b[31m", "\x1b[32m", "\x1b[0m"
    folded = lines_of({r: f"{green}loss {v}{end}" for r, v in enumerate(["2.1", "2.2", "2.3", "2.2"])})
    assert folded == [("stdout", f"{green}loss 2.1…2.3{end}", [0, 1, 2, 3])]
    assert len(lines_of({0: f"{green}ok 1{end}", 1: f"{red}ok 1{end}"})) == 2  # another colour: another word


def test_very_long_lines_and_lines_of_many_numbers_fold_only_when_identical():
    from ppkit.cluster.output import fold

    long = ["x" * fold.MAX_CHARS + f" {r}" for r in range(3)]
    assert len(lines_of(dict(enumerate(long)))) == 3
    assert lines_of({0: long[0], 1: long[0]}) == [("stdout", long[0], [0, 1])]
    tensor = [str(list(range(r, r + fold.MAX_NUMBERS + 1))) for r in range(2)]
    assert len(lines_of(dict(enumerate(tensor)))) == 2


def test_a_fast_ranks_numbered_line_waits_at_most_the_window():
    c = Collapser([0, 1, 2, 3], window_s=0.5)
    c.add(0, "stdout", "step 1 loss 2.5", 0.0)
    c.add(1, "stdout", "step 1 loss 2.6", 0.1)
    c.add(3, "stdout", "step 1 loss 2.5", 0.1)
    assert c.ready(0.4) == []  # rank 2 may still print it
    assert c.ready(0.5) == [("stdout", "step 1 loss 2.5", [0, 3]), ("stdout", "step 1 loss 2.6", [1])]
    c.add(2, "stdout", "step 1 loss 2.7", 0.6)
    assert c.ready(1.1) == [("stdout", "step 1 loss 2.7", [2])]


def test_tqdms_lines_are_never_folded(capsys):
    printer = RankPrinter(world_size=2)
    with printer.use(OutputSettings(collapse=True, live=True)):
        printer.write(0, "stderr", "\r  0%|   | 0/4\r100%|###| 4/4 [00:01<00:00, 3.21it/s]\n")
        printer.write(1, "stderr", "\r  0%|   | 0/4\r100%|###| 4/4 [00:01<00:00, 3.87it/s]\n")
    err = capsys.readouterr().err
    assert "[rank 0] 100%|###| 4/4 [00:01<00:00, 3.21it/s]\n" in err, err
    assert "[rank 1] 100%|###| 4/4 [00:01<00:00, 3.87it/s]\n" in err and "…" not in err


def test_no_collapse_keeps_every_ranks_raw_line(capsys):
    for settings in (parse("--nproc-per-node 2 --no-collapse").output, OutputSettings(collapse=False, live=True)):
        printer = RankPrinter(world_size=2)
        with printer.use(settings):
            printer.write(0, "stdout", "step 1 loss 2.5\n")
            printer.write(1, "stdout", "step 1 loss 2.6\n")
        assert capsys.readouterr().out == "[rank 0] step 1 loss 2.5\n[rank 1] step 1 loss 2.6\n"


def test_a_line_with_a_nul_character_never_meets_a_numbered_line_of_that_shape():
    assert lines_of({0: "a \x00 b", 1: "a 2.31 b", 2: "a 2.33 b", 3: "a 2.35 b", 4: "a 2.33 b"}) == [
        ("stdout", "a \x00 b", [0]), ("stdout", "a 2.31…2.35 b", [1, 2, 3, 4])]
