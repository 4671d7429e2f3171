"""Folding never changes what a line says about a rank: each folded line, read by the rule that
docs/torchrun.md gives (a spread ``a…b``: every rank not named wrote a value from a to b; ``(rank r: v)``:
rank r wrote v; anything else: every rank wrote exactly that), is true of every rank it names. Checked on
the course's own prints (notebooks 01 and 02, real ranks), PyTorch's TP and SP examples, and random lines."""

from __future__ import annotations

import contextlib
import io
import random
import re

import pytest

from ppkit.cluster.output import OutputSettings, RankPrinter
from ppkit.cluster.output import fold as folding
from ppkit.cluster.output.collapse import Collapser
from ppkit.lessons import seed001

NUMBER = r"[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
# the checker's own idea of a number, not fold's: any run of digits (a word's too: what fold leaves as a word
# must then be in the folded line as written), so a bug in fold's tokenizer cannot hide in the check
TOKEN = re.compile(r"(?P<number>[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?)(?P<unit>%|[A-Za-z]*)")
HOLE = re.compile(rf"(?P<low>{NUMBER})(?P<unit>%|[^\W\d_]*)(?:…(?P<high>{NUMBER})(?P=unit))?"
                  r"(?: \((?P<named>rank \d+: [^()]*?(?:, rank \d+: [^()]*?)*)\))?")


def false_about(folded: str, rank: int, line: str) -> str | None:
    """What ``folded`` says falsely about ``rank``, whose line was ``line`` (None: nothing)."""
    if folded == line:
        return None
    tokens = list(TOKEN.finditer(line))
    parts = [line[a.end() if a else 0:b.start() if b else len(line)]
             for a, b in zip([None, *tokens], [*tokens, None])]
    numbers = [(t["number"], t["unit"], float(t["number"])) for t in tokens]
    at = 0
    for i, (text, unit, value) in enumerate(numbers):
        if not folded.startswith(parts[i], at):
            return f"the text around the numbers differs: {folded!r} against {line!r}"
        at += len(parts[i])
        hole = HOLE.match(folded, at)
        if hole is None or hole["unit"] != unit:
            return f"number {i} ({text}{unit}) is not where {folded!r} has it"
        named = dict(item.split(": ", 1) for item in (hole["named"] or "").split(", ") if item)
        if f"rank {rank}" in named:
            if named[f"rank {rank}"] != text + unit:
                return f"{folded!r} says rank {rank} wrote {named[f'rank {rank}']}, it wrote {text}{unit}"
        elif hole["high"] is None:
            if hole["low"] != text:
                return f"{folded!r} says rank {rank} wrote {hole['low']}{unit}, it wrote {text}{unit}"
        elif not float(hole["low"]) <= value <= float(hole["high"]):
            return f"{folded!r} puts rank {rank}'s {text}{unit} between {hole['low']} and {hole['high']}"
        at = hole.end()
    if folded[at:] != parts[-1]:
        return f"the text after the numbers differs: {folded!r} against {line!r}"
    return None


NAMED = re.compile(r"\(rank \d+: ")


def check_truth(shown: list[tuple[str, list[int]]], printed: dict[int, list[str]],
                points: dict[int, list] | None = None) -> None:
    """Every shown ``(text, ranks)`` is true of each of its ranks, in each rank's order, and every line is shown.
    A line that names a rank as standing out (``(rank 3: 0.656)``) says more: that its ranks' lines are the same
    point of the program, where rank 3 differed from the others. ``points``: each rank's lines' points (what
    the program was at when it printed each, known to the test, never read from the text); without them no
    line may name a rank."""
    left = {rank: list(lines) for rank, lines in printed.items()}
    at = {rank: list(points[rank]) if points else [None] * len(lines) for rank, lines in printed.items()}
    for text, ranks in shown:
        where = set()
        for rank in ranks:
            assert left[rank], f"{text!r} is said of rank {rank}, which printed nothing more"
            wrong = false_about(text, rank, left[rank].pop(0))
            assert wrong is None, wrong
            where.add(at[rank].pop(0))
        if NAMED.search(text):
            assert points is not None, f"{text!r} names a rank as standing out where nothing says the lines meet"
            assert len(where) == 1, f"{text!r} names a rank as standing out on lines of different points: {where}"
    assert not any(left.values()), f"lines never shown: {left}"


def collapsed(printed: dict[int, list[str]]) -> list[tuple[str, list[int]]]:
    """What the collapser shows of each rank's lines, all printed at once."""
    c = Collapser(sorted(printed))
    for rank, lines in printed.items():
        for line in lines:
            c.add(rank, "stdout", line, 0.0)
    return [(text, ranks) for _, text, ranks in c.ready(0.0) + c.flush()]


def through_printer(printed: dict[int, list[str]]) -> list[tuple[str, list[int]]]:
    """What a cell shows of each rank's lines, written rank after rank as %%torchrun's printer gets them."""
    printer, out = RankPrinter(world_size=len(printed)), io.StringIO()
    with contextlib.redirect_stdout(out), printer.use(OutputSettings(collapse=True)):
        for rank, lines in printed.items():
            printer.write(rank, "stdout", "".join(line + "\n" for line in lines))
    shown = []
    for line in out.getvalue().splitlines():
        label, text = re.fullmatch(r"\[ranks? ([\d,-]+)\] (.*)", line).groups()
        ranks = [r for part in label.split(",") for r in range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1)]
        shown.append((text, ranks))
    return shown


def shown_text(printed: dict[int, list[str]]) -> list[str]:
    return [OutputSettings().label(ranks) + text for text, ranks in collapsed(printed)]


# -- the cases seen ----------------------------------------------------------------------------------

def test_a_number_that_is_the_rank_or_differs_on_every_rank_is_never_spread():
    tp = {r: [f"Starting PyTorch TP example on rank {r}."] for r in range(2)}
    assert shown_text(tp) == [f"[rank {r}] Starting PyTorch TP example on rank {r}." for r in range(2)]
    bye = {r: [f"bye {r}"] for r in range(4)}
    assert shown_text(bye) == [f"[rank {r}] bye {r}" for r in range(4)]
    # a scatter: each rank got its own value, and no line may suggest which rank got which
    got = {0: "10.5", 1: "40.25", 2: "99.5", 3: "20.75"}
    scatter = {r: [f"rank {r} got {v}"] for r, v in got.items()}
    assert shown_text(scatter) == [f"[rank {r}] rank {r} got {v}" for r, v in got.items()]
    # values that all differ: those within 10 % are one quantity up to noise, the one far off is apart
    losses = {r: [f"loss {v}"] for r, v in enumerate(["2.31", "2.35", "2.91", "2.33"])}
    assert shown_text(losses) == ["[ranks 0-1,3] loss 2.31…2.35", "[rank 2] loss 2.91"]


def test_a_tensors_printed_form_is_kept_exact():
    printed = {r: [f"Rank  {r}  has data  tensor([{10 * (r + 1)}.])", f"grad tensor([{r % 2}.5000, 1.0000])"]
               for r in range(4)}
    shown = collapsed(printed)
    check_truth(shown, printed)
    assert ("grad tensor([0.5000, 1.0000])", [0, 2]) in shown and ("grad tensor([1.5000, 1.0000])", [1, 3]) in shown
    assert not any("…" in text for text, _ in shown), shown
    # a tensor too long for one line: its middle and last lines hold no opening bracket
    wrapped = {r: ["tensor([0.1000, 0.2000,", f"        0.{[1, 1, 2, 3][r]}500, 0.6000,",
                   f"        0.{[1, 1, 2, 3][r]}700, 0.8000])"] for r in range(4)}
    shown = collapsed(wrapped)
    check_truth(shown, wrapped)
    assert not any("…" in text for text, _ in shown), shown


def test_lines_whose_counters_differ_are_never_joined():
    printed = {0: ["step 8 loss 2.31"], 1: ["step 3 loss 2.35"], 2: ["step 8 loss 2.33"], 3: ["step 8 loss 2.32"]}
    shown = collapsed(printed)
    check_truth(shown, printed)
    assert ("step 3 loss 2.35", [1]) in shown and not any("3…8" in text for text, _ in shown), shown
    # DistributedSampler's uneven split: a count, said of the ranks that have it
    samples = {r: [f"rank has {13 if r < 5 else 12} samples"] for r in range(8)}
    assert shown_text(samples) == ["[ranks 0-4] rank has 13 samples", "[ranks 5-7] rank has 12 samples"]


def test_a_split_between_two_values_says_which_ranks_have_which():
    printed = {r: [f"loss {v}"] for r, v in enumerate(["2.31", "2.31", "7.5", "7.5"])}
    assert shown_text(printed) == ["[ranks 0-1] loss 2.31", "[ranks 2-3] loss 7.5"]
    # one rank off a majority of 4 or 8 is named on the line, as documented, where the line says its step
    one_off = {r: [f"step 10 loss {v}"] for r, v in enumerate(["2.31", "2.31", "2.91", "2.31"])}
    assert shown_text(one_off) == ["[ranks 0-3] step 10 loss 2.31 (rank 2: 2.91)"]
    unstepped = {r: [f"loss {v}"] for r, v in enumerate(["2.31", "2.31", "2.91", "2.31"])}
    assert shown_text(unstepped) == ["[ranks 0-1,3] loss 2.31", "[rank 2] loss 2.91"]


def test_timestamps_are_never_folded_so_a_log_parser_still_reads_them():
    stamps = ["17:20:38,015", "17:20:38,991", "17:20:39,402", "17:20:38,015"]
    printed = {r: [f"{s} INFO step done in 1.{r % 3}5s"] for r, s in enumerate(stamps)}
    shown = collapsed(printed)
    check_truth(shown, printed)
    for text, _ in shown:
        assert re.match(r"\d\d:\d\d:\d\d,\d{3} INFO", text), text
    dated = {r: [f"12/07/2026 06:54:{22 + r % 2} PM Device Mesh created"] for r in range(4)}
    assert all(re.fullmatch(r"12/07/2026 06:54:2\d PM Device Mesh created", t) for t, _ in collapsed(dated))


def test_more_than_one_spread_on_a_line_is_never_shown():
    """Two spreads side by side read as a mapping (the lowest loss with the shortest time): keep the lines apart."""
    values = [("2.31", "1.2"), ("2.31", "1.9"), ("2.35", "1.2"), ("2.38", "1.5"), ("2.35", "1.9"), ("2.31", "1.5")]
    printed = {r: [f"loss {a} took {b}s"] for r, (a, b) in enumerate(values)}
    shown = collapsed(printed)
    check_truth(shown, printed)
    assert not any(text.count("…") > 1 for text, _ in shown), shown


# -- random lines ------------------------------------------------------------------------------------

WORDS = ["step", "loss", "rank", "took", "lr", "acc", "tensor([", "])", "at", ":", "of", "[", "]", "(", ")", ","]


def _random_number(rng: random.Random, rank: int) -> str:
    kind = rng.choice(["int", "float", "unit", "rank", "exp", "same"])
    if kind == "int":
        return str(rng.choice([3, 8, 12, 13, 100]))
    if kind == "float":
        return rng.choice(["2.31", "2.35", "2.91", "7.5", "-0.5", "0.0"])
    if kind == "unit":
        return rng.choice(["1.2s", "1.3s", "91%", "93%", "4ms"])
    if kind == "rank":
        return str(rank)
    if kind == "exp":  # beyond a float's range too: a line must never be lost to its numbers
        return rng.choice(["1e-3", "2.5E-2", "1e-3", "1e400", "1e309", "-1e999", "1.5e308", "1e-400"])
    return "42"


ROW_SPREAD = re.compile(rf"{NUMBER}%?[^\W\d_]*…{NUMBER}\S*\.? +{NUMBER}|{NUMBER}\.? +{NUMBER}%?[^\W\d_]*…")


def test_random_lines_folded_say_nothing_false_about_any_rank():
    rng = random.Random(52)
    for _ in range(1500):
        world = rng.choice([2, 3, 4, 8])
        template = [rng.choice(WORDS + ["#"] * 4) for _ in range(rng.randint(1, 7))]
        printed = {}
        for rank in range(world):
            fixed = random.Random(rng.random())  # some ranks share their numbers, some don't
            pick = rng if rng.random() < 0.5 else fixed
            printed[rank] = [" ".join(_random_number(pick, rank) if w == "#" else w for w in template)]
        shown = collapsed(printed)
        check_truth(shown, printed, points={rank: [0] for rank in printed})  # one line each, of one print
        # numbers with only spaces between are a row (an array's, a table's): never spread inside it
        assert not any(ROW_SPREAD.search(text) for text, _ in shown), (shown, printed)


# -- the course's own prints and PyTorch's examples, at 4 ranks -----------------------------------------

def _printed_by_rank(cluster, fn) -> dict[int, list[str]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cluster.run(fn)
    printed: dict[int, list[str]] = {r: [] for r in range(cluster.world_size)}
    for line in out.getvalue().splitlines():
        match = re.match(r"\[rank (\d+)\] (.*)", line)
        if match:
            printed[int(match[1])].append(match[2])
    return printed


@pytest.mark.parametrize("fn", [seed001.test_broadcast, seed001.test_scatter, seed001.test_reduce,
                                seed001.test_all_reduce, seed001.test_gather, seed001.test_all_gather])
def test_notebook_02s_prints_at_four_real_ranks_fold_truthfully(cluster4, fn):
    printed = _printed_by_rank(cluster4, fn)
    assert all(printed.values()) or fn is seed001.test_gather, printed
    shown = through_printer(printed)
    check_truth(shown, printed)
    assert not any("…" in text for text, _ in shown), shown  # the rank, a tensor's values: never spread
    if fn is seed001.test_scatter:
        assert [text for text, _ in shown if "has data" in text] == \
            [f"Rank  {r}  has data  tensor([{r + 1}.])" for r in range(4)], shown


NOTEBOOK_01S_PRINT = "print('Rank ', rank, ' has data ', tensor[0])"


def _send_recv_in_pairs(rank, size):
    """Notebook 01's point-to-point exchange, in pairs (0 -> 1, 2 -> 3: its own code pairs only 0 with 1),
    each pair its own value, printed with the notebook's own line."""
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(1)
    if rank % 2 == 0:
        tensor += 1 + rank // 2
        dist.send(tensor=tensor, dst=rank + 1)
    else:
        dist.recv(tensor=tensor, src=rank - 1)
    print('Rank ', rank, ' has data ', tensor[0])


def test_notebook_01s_prints_fold_truthfully_at_four_ranks(cluster4):
    import inspect

    for fn in (seed001.test_send_recv_sync, seed001.test_send_recv_async, _send_recv_in_pairs):
        assert NOTEBOOK_01S_PRINT in inspect.getsource(fn), fn  # the line the notebook prints, as it prints it
    printed = _printed_by_rank(cluster4, _send_recv_in_pairs)
    assert printed == {r: [f"Rank  {r}  has data  tensor({1 + r // 2}.)"] for r in range(4)}, printed
    shown = through_printer(printed)
    check_truth(shown, printed)
    assert shown == [(f"Rank  {r}  has data  tensor({1 + r // 2}.)", [r]) for r in range(4)], shown


def test_pytorchs_tp_and_sp_examples_prints_through_the_printer():
    """The lines torch's examples/distributed/tensor_parallelism print at 4 ranks, each rank's as it writes it."""
    printed = {rank: [f"Starting PyTorch TP example on rank {rank}.",
                      f"Starting PyTorch Sequence Parallel example on rank {rank}.",
                      f"12/07/2026 06:54:{22 + rank // 2} PM Device Mesh created: "
                      "device_mesh=DeviceMesh('cpu', [0, 1, 2, 3])",
                      f"12/07/2026 06:54:{23 + rank // 2} PM Tensor Parallel iter {rank % 2} completed",
                      "Tensor Parallel training completed!"] for rank in range(4)}
    shown = through_printer(printed)
    assert ("Tensor Parallel training completed!", [0, 1, 2, 3]) in shown, shown
    assert all((f"Starting PyTorch TP example on rank {r}.", [r]) in shown for r in range(4)), shown
    check_truth(shown, printed)


# -- programs a review ran that the tests above did not hold -------------------------------------------

def test_a_number_beyond_a_floats_range_never_costs_a_line():
    for bound in ("1e400", "1e309", "-1e999", "1e-4" + "0" * 5000):
        printed = {r: [f"bound {bound} loss {['2.31', '2.31', '2.35'][r]}", f"max {['1e309', '2.0', '1e400'][r]}"]
                   for r in range(3)}
        shown = through_printer(printed)
        check_truth(shown, printed, points={r: ["bound", "max"] for r in printed})  # each rank's two prints
        assert ("max 2.0", [1]) in shown, shown  # inf against a number cannot be spread


def test_a_fold_that_fails_shows_each_ranks_line_as_it_wrote_it(monkeypatch):
    def broken(lines, first=False):
        raise ZeroDivisionError("a bug in fold")

    monkeypatch.setattr(folding, "fold", broken)
    printed = {r: [f"loss {['2.31', '2.31', '2.35', '2.33'][r]}", "done"] for r in range(4)}
    shown = through_printer(printed)
    check_truth(shown, printed)
    assert shown == [("loss 2.31", [0, 1]), ("loss 2.35", [2]), ("loss 2.33", [3]), ("done", [0, 1, 2, 3])], shown


def test_an_arrays_wrapped_lines_and_a_tables_rows_are_kept_exact():
    import numpy as np

    printed = {}
    for r in range(4):
        a = np.round(np.linspace(0, 2, 41), 4)
        a[20] = [0.1, 0.1, 0.2, 0.3][r]  # on the middle line: no bracket, no comma, numbers apart by spaces
        printed[r] = str(a).splitlines()
    assert len(printed[0]) == 3 and "[" not in printed[0][1], printed[0]
    table = {r: ["   epoch   loss    acc", "0      0  2.310  0.910",
                 f"1      1  {['2.350', '2.350', '2.400', '2.450'][r]}  0.920"] for r in range(4)}
    for lines in (printed, table):
        shown = through_printer(lines)
        check_truth(shown, lines)
        assert not any("…" in text or "(rank" in text for text, _ in shown), shown


def test_values_too_far_apart_to_be_noise_say_which_rank_holds_which():
    got = ["10.0", "10.0", "20.0", "30.0", "40.0", "50.0", "60.0", "70.0"]  # a scatter with a learner's bug
    shown = through_printer({r: [f"got {v}"] for r, v in enumerate(got)})
    assert shown == [("got 10.0", [0, 1])] + [(f"got {v}", [r]) for r, v in enumerate(got) if r > 1], shown
    bug = {r: [f"rank got {v}"] for r, v in enumerate(["40.0", "40.0", "10.0", "70.0"])}
    assert shown_text(bug) == ["[ranks 0-1] rank got 40.0", "[rank 2] rank got 10.0", "[rank 3] rank got 70.0"]
    noise = {r: [f"loss {v}"] for r, v in enumerate(["2.31", "2.35", "2.31", "2.33"])}  # one quantity: spread
    assert shown_text(noise) == ["[ranks 0-3] loss 2.31…2.35"]


def test_fractional_counters_and_progress_are_never_spread():
    epochs = ["1.50", "1.50", "1.25", "1.00"]
    printed = {r: [f"epoch {e} lr 0.0010", f"train epoch {e} done", f"{[45, 45, 47, 46][r]}% done",
                   f"iter {['3.5', '3.5', '3.4', '3.5'][r]} loss 2.31"] for r, e in enumerate(epochs)}
    shown = through_printer(printed)
    check_truth(shown, printed)
    assert not any("…" in text or "(rank" in text for text, _ in shown), shown
    assert ("epoch 1.50 lr 0.0010", [0, 1]) in shown and ("45% done", [0, 1]) in shown, shown


def test_a_lagging_ranks_earlier_line_is_never_named_as_standing_out():
    """Ranks 0-2 print an epoch and its loss every 0.3 s; rank 3 starts 0.9 s late, so its epoch-0 loss arrives
    with the others' epoch-2 loss. It did not diverge: no line may name it as the rank that stands out."""
    collapser, out, events = Collapser([0, 1, 2, 3]), [], []
    for r in range(4):
        start = 0.9 if r == 3 else 0.0
        for e in range(4 if r < 3 else 2):
            t = start + 0.3 * e
            events += [(t, r, f"epoch {e}"), (t + 0.01, r, f"loss {2.0 - 0.1 * e + 0.01 * (r % 2):.2f}")]
    for t, r, line in sorted(events):
        collapser.add(r, "stdout", line, t)
        out += collapser.ready(t)
    out += collapser.ready(10.0) + collapser.flush()
    shown = [(text, ranks) for _, text, ranks in out]
    assert ("loss 2.01", [3]) in shown and not any("(rank" in text for text, _ in shown), shown
    check_truth(shown, {r: [line for _, rank, line in sorted(events) if rank == r] for r in range(4)})
    # a step counter of one value on every rank's line says the lines are the same point: the rank is named
    stepped = {r: [f"step 4 loss {['1.80', '1.81', '1.80', '2.51'][r]}"] for r in range(4)}
    assert shown_text(stepped) == ["[ranks 0-3] step 4 loss 1.80…1.81 (rank 3: 2.51)"]
    # without one, nothing says so (the first lines of each rank may be different steps): the lines stay apart
    unstepped = {r: [f"loss {['1.80', '1.81', '1.80', '2.51'][r]}"] for r in range(4)}
    assert shown_text(unstepped) == ["[ranks 0,2] loss 1.80", "[rank 1] loss 1.81", "[rank 3] loss 2.51"]


# -- review 52b: uneven data, and values of each rank's own within 10 % ------------------------------------

def _uneven(batches: list[int], line) -> tuple[dict[int, list[str]], dict[int, list]]:
    """Each rank's lines over 2 epochs of ``batches[rank]`` batches, and the point (epoch, batch) of each."""
    points = {r: [(e, b) for e in range(2) for b in range(n)] for r, n in enumerate(batches)}
    return {r: [line(e, b) for e, b in points[r]] for r in points}, points


def test_uneven_data_never_names_a_rank_that_moved_on_as_standing_out():
    """Review 52b F19: rank 3's shard has one batch fewer, every rank has the same loss at each step. Rank 3's
    first loss of epoch 1 meets the others' last of epoch 0 (the fourth line of each): the fold said
    ``[ranks 0-3] loss 0.729 (rank 3: 0.656)``, that rank 3 diverged. Nothing on the line says which step
    it is, so the lines stay apart."""
    printed, points = _uneven([4, 4, 4, 3], lambda e, b: f"loss {0.9 ** (b + 4 * e):.3f}")
    shown = collapsed(printed)
    check_truth(shown, printed, points)
    assert ("loss 0.729", [0, 1, 2]) in shown and ("loss 0.656", [3]) in shown, shown
    assert shown[:3] == [(f"loss {v}", [0, 1, 2, 3]) for v in ("1.000", "0.900", "0.810")], shown
    # printed with the epoch and the batch, the lines say their step: lines of two steps never join, and the
    # ranks of one step that differ are named
    labelled, _ = _uneven([4, 4, 4, 3], lambda e, b: f"epoch {e} batch {b} loss {0.9 ** (b + 4 * e):.3f}")
    for shown in (collapsed(labelled), through_printer(labelled)):
        check_truth(shown, labelled, points)
        assert ("epoch 0 batch 3 loss 0.729", [0, 1, 2]) in shown and not any("(rank" in t for t, _ in shown), shown
    odd = {r: [f"epoch {e} batch {b} loss {(0.7 if r == 2 and b == 1 else 0.9) ** b:.3f}" for e, b in points[r]]
           for r in points}
    shown = collapsed(odd)
    check_truth(shown, odd, points)
    assert ("epoch 0 batch 1 loss 0.900 (rank 2: 0.700)", [0, 1, 2, 3]) in shown, shown


def test_uneven_data_printed_as_it_runs_never_names_a_rank_that_moved_on():
    """Review 52b F18, with each line's time: every rank prints a batch's loss every 0.05 s, rank 3 has one
    batch fewer in epoch 0."""
    points = {r: [(e, b) for e in range(2) for b in range(3 if r == 3 and e == 0 else 4)] for r in range(4)}
    collapser, out, events = Collapser([0, 1, 2, 3]), [], []
    for r, at in points.items():
        events += [(0.05 * (i + 1) + 0.001 * r, r, f"train loss {1.0 / (1 + b + 4 * e):.4f}")
                   for i, (e, b) in enumerate(at)]
    for t, r, line in sorted(events):
        collapser.add(r, "stdout", line, t)
        out += collapser.ready(t)
    out += collapser.ready(10.0) + collapser.flush()
    shown = [(text, ranks) for _, text, ranks in out]
    check_truth(shown, {r: [line for _, rank, line in sorted(events) if rank == r] for r in range(4)}, points)
    assert not any("(rank" in text for text, _ in shown), shown


def test_values_within_ten_percent_read_the_same_whether_or_not_two_ranks_wrote_the_same():
    """Review 52b F1 and F13: a spread was shown where one value repeated (``my shard sum 100.0…107.0``) but
    not where every value differed: the same kind of values, read two ways. Either is a spread now; a
    learner who wants each rank's own value prints the rank, and the lines stay apart."""
    for values in (["100.0", "100.0", "104.0", "107.0"], ["100.0", "101.0", "104.0", "107.0"]):
        assert shown_text({r: [f"my shard sum {v}"] for r, v in enumerate(values)}) == \
            ["[ranks 0-3] my shard sum 100.0…107.0"], values
    for values in (["10.1", "10.1", "10.4", "10.9"], ["10.1", "10.2", "10.4", "10.9"]):
        assert shown_text({r: [f"processed {v}k tokens"] for r, v in enumerate(values)}) == \
            ["[ranks 0-3] processed 10.1k…10.9k tokens"], values
    own = {r: [f"rank {r} my shard sum {v}"] for r, v in enumerate(["100.0", "100.0", "104.0", "107.0"])}
    assert len(collapsed(own)) == 4


def test_a_counter_written_again_names_no_rank_after_its_first_line(monkeypatch):
    """An epoch on each batch's line labels several points alike: only each rank's first line of the label is
    one point; after it, and past the labels a collapser remembers, the rank that stands out is shown apart."""
    printed = {r: [f"epoch 1 loss {['2.31', '2.31', '2.31', '2.91'][r]}"] * 2 for r in range(4)}
    assert shown_text(printed) == ["[ranks 0-3] epoch 1 loss 2.31 (rank 3: 2.91)",
                                   "[ranks 0-2] epoch 1 loss 2.31", "[rank 3] epoch 1 loss 2.91"]
    from ppkit.cluster.output import collapse

    monkeypatch.setattr(collapse, "MAX_LABELS", 1)
    printed = {r: [f"step {s} loss {['2.31', '2.31', '2.31', '2.91'][r]}" for s in (1, 2)] for r in range(4)}
    assert shown_text(printed) == ["[ranks 0-3] step 1 loss 2.31 (rank 3: 2.91)",
                                   "[ranks 0-2] step 2 loss 2.31", "[rank 3] step 2 loss 2.91"]


def _random_run(rng: random.Random) -> tuple[dict[int, list[str]], dict[int, list]]:
    """A training loop's prints at a few ranks: each step's line holds a value that is one on every rank at
    that step (and now and then one rank's odd value), ranks stop early (uneven data) or skip a step's
    print; the line says its step, its epoch only (one label for several steps), or nothing."""
    world, steps, per_epoch = rng.choice([3, 4, 8]), rng.randint(2, 9), rng.randint(2, 4)
    label = rng.choice(["", "step {s} ", "epoch {e} ", "epoch {e} step {s} "])
    template = rng.choice(["loss {v:.3f}", "took {v:.2f}s", "acc {v:.1f}%", "loss {v:.3f} lr 0.1"])
    printed, points = {}, {}
    for rank in range(world):
        stop = steps - (rng.random() < 0.3) * rng.randint(1, 2)
        skipped = {s for s in range(steps) if rng.random() < 0.15}
        if label == "epoch {e} ":  # one label for several steps: a rank may end an epoch early, not skip inside it
            skipped = {s for s in range(steps) if s % per_epoch == per_epoch - 1 and rng.random() < 0.3}
        points[rank] = [s for s in range(stop) if s not in skipped]
        printed[rank] = []
        for s in points[rank]:
            value = 2.0 * 0.9 ** s * (1.5 if rng.random() < 0.1 else 1.0)
            printed[rank].append(label.format(s=s, e=s // per_epoch) + template.format(v=value))
    return printed, points


def test_random_training_loops_name_a_rank_only_on_lines_of_one_step():
    rng, named = random.Random(5219), 0
    for _ in range(1500):
        printed, points = _random_run(rng)
        for shown in (collapsed(printed), through_printer(printed)):
            check_truth(shown, printed, points)
            named += sum("(rank" in text for text, _ in shown)
    assert named > 100, named  # the rule still names ranks where the lines say their step
