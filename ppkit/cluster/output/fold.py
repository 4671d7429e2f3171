"""Lines of several ranks that differ only in their numbers, shown as one line that says where they
differ: ``step 10 loss 2.31…2.35 (rank 5: 2.91)``, read as: every rank not named wrote a loss from 2.31
to 2.35, rank 5 wrote 2.91, and every other number is what each rank wrote.

A line's ``shape`` is its text with its numbers taken out (``step # loss #``); lines of one shape meet
(collapse.py decides which), and ``fold`` shows them as one line only where that line is true of every
rank and cannot be read as something else. Otherwise the lines stay apart, grouped by the number that
keeps them apart (each group folded again), one line per group with its ranks:

- a number that says which line is which is never spread: a whole number without a unit or with ``%`` (a
  step, an epoch, a count, a progress: ``step 3`` never joins ``step 8``), a number after a counter's name
  (``epoch 1.50``, ``iter``, ``step``, ``batch``, ``progress``), the rank itself, or a number that cannot be
  compared (``1e400``);
- a number inside brackets (a tensor's, a list's or a tuple's printed form, a wrapped tensor's lines), next
  to another with only a comma or spaces between (an array's wrapped line ``0.923 1.    1.462``, a table's
  row), or in a time or a date (``17:20:38,015``, ``2026-12-07``) is kept as written, so the printed form
  stays exact and a log parser still reads the line;
- values are spread only where they are one quantity up to noise: the lowest and the highest of the spread
  differ by at most ``REL_TOL`` of the larger magnitude (losses ``2.31…2.35``, times ``0.52s…0.53s``),
  whether or not two ranks wrote the same value; values further apart (a scatter's ``10.0`` … ``70.0``, a
  learner's bug that gave two ranks one chunk) stay apart, each line with its ranks. A spread says every
  rank's value is in it, not which rank holds which: text cannot tell a loss's noise from each rank's own
  data (``my shard sum 100.0…107.0``), so a line that holds the rank (``rank 2 sum 104.0``) stays each
  rank's own, and ``--no-collapse`` shows every line as written;
- a number with two values that names no rank is said of the ranks of each: ``[ranks 0-1] loss 2.31``
  and ``[ranks 2-3] loss 7.5``, not ``loss 2.31…7.5``;
- at most one number of a line is spread (two spreads side by side read as lowest with lowest).

A spread is the lowest ``…`` the highest, as the ranks wrote them. A rank that stands out
(``standing_out``; a difference of one step in the last digit written names no rank) is named with its
value outside the spread only where the line says which point of the program it is: a number after a
counter's name (``step 10``, ``epoch 1 batch 3``), of one value on every rank's line, each line the first
its rank wrote with that text and those counters (``fold(..., first=True)``, which the collapser says).
The place of a line in each rank's output is no such evidence: with uneven data, rank 3's first loss of
epoch 1 is its fourth line, as the others' last loss of epoch 0 is theirs, and naming rank 3 there would
say it diverged. Lines without a counter, lines met only because they arrived together (a lagging rank's
earlier epoch beside the others' later one), and a counter written again (an epoch on each batch's line,
after its first) name no rank: the one that stands out is shown on a line of its own. The counter is the
learner's own label: lines labelled alike are compared as one point. A word that differs keeps lines
apart: ``nan`` against ``2.31``, ``ms`` against ``s``.

A number is a decimal with an optional sign, fraction, exponent and unit (``-0.5``, ``1e-3``, ``91%``,
``1.2s``), not part of a word: ``worker3``, ``0x7f3a``, ``2.14.1`` and ``10.0.0.1`` are words. ANSI
colour codes are words. A line longer than ``MAX_CHARS``, or with more than ``MAX_NUMBERS`` numbers
(a tensor, a list: the numbers are the message), folds only with the same line.
"""

from __future__ import annotations

import functools
import math
import re
import statistics

SPREAD = "…"
MAX_CHARS = 1000
MAX_NUMBERS = 16
Z = 3.5  # Iglewicz and Hoaglin's cut-off for the modified z-score
REL_TOL = 0.1  # a spread's width, at most, as a share of its larger end's magnitude: one quantity up to noise
_COUNTER = re.compile(r"(?:epoch|epochs|step|steps|iter|iters|iteration|it|batch|progress)\W*$", re.IGNORECASE)
_ROW = re.compile(r"\.?[ \t]+")  # between two numbers of an array's or a table's row (numpy writes ``1.   2.``)
HOLE = "\x00"  # where a number was, in a shape
_WHOLE = re.compile(r"[-+]?\d+")
_JOINS = {":", ",", "/", "-", "."}  # between the numbers of a time or a date

_ANSI = re.compile(r"(\x1b\[[0-?]*[ -/]*[@-~])")
_NUMBER = re.compile(r"(?<![\w.])"  # not inside a word, an address or a version
                     r"(?P<number>[-+]?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?)(?P<unit>%|[^\W\d_]*)"
                     r"(?!\w|\.\w)")


def shape(text: str) -> tuple[str, str]:
    """``("#", text with each number replaced by a hole, its unit kept)``; ``exact(text)`` when the line
    folds only with the same line."""
    if len(text) > MAX_CHARS:
        return exact(text)
    parts, numbers = _split(text)
    if not numbers or len(numbers) > MAX_NUMBERS:
        return exact(text)
    return "#", "".join(part + HOLE + unit for part, (_, unit, _) in zip(parts, numbers)) + parts[-1]


def exact(text: str) -> tuple[str, str]:
    """The shape of a line that folds only with the same line (never with a numbered one, whatever it holds)."""
    return "=", text


def counters(text: str) -> tuple[str, ...]:
    """The values of the numbers that follow a counter's name (``epoch 1 step 40 loss 2.31``: ``("1", "40")``),
    as written: the point of the program the line says it is at."""
    parts, numbers = _split(text)
    return tuple(number + unit for part, (number, unit, _) in zip(parts, numbers)
                 if _COUNTER.search(_ANSI.sub("", part)))


def fold(lines: list[tuple[int, str]], first: bool = False) -> list[tuple[list[int], str]]:
    """``(rank, text)`` lines of one shape as ``(ranks, text)`` lines, in the order of their lowest rank:
    one line where the numbers may be folded (the module's docstring), else one for each group of ranks
    that wrote the same. ``first``: each line is the first its rank wrote with this shape and these
    counters' values (collapse.py keeps count), so lines that carry a counter of one value are the same
    point of each rank's program, and a rank that stands out may be named on the folded line."""
    return _fold(sorted(lines), first)


def _fold(lines: list[tuple[int, str]], first: bool = False) -> list[tuple[list[int], str]]:
    texts = [text for _, text in lines]
    if all(text == texts[0] for text in texts):
        return [([rank for rank, _ in lines], texts[0])]
    parts, _ = _split(texts[0])
    numbers = [_split(text)[1] for text in texts]
    varying = [i for i in range(len(numbers[0])) if len({row[i][0] for row in numbers}) > 1]
    for i in varying:  # a number that says which line is which: the lines stay apart, by its value
        column = [row[i] for row in numbers]
        if (_in_structure(parts, i) or _in_time(parts, i) or _COUNTER.search(_ANSI.sub("", parts[i]))
                or _identifies(column, [rank for rank, _ in lines])):
            return _apart(lines, [row[i][0] for row in numbers], first)
    # the counters (if any) are of one value here: with each line its rank's first of it, one point of the program
    same_point = first and any(_COUNTER.search(_ANSI.sub("", part)) for part in parts[:-1])
    spreads, out = 0, [parts[0]]
    for i in range(len(numbers[0])):
        column = [(rank, row[i]) for (rank, _), row in zip(lines, numbers)]
        odd = standing_out([value for _, (_, _, value) in column],
                           resolution=max(resolution(text) for _, (text, _, _) in column))
        if i in varying and not odd and len({text for _, (text, _, _) in column}) == 2:
            return _apart(lines, [row[i][0] for row in numbers], first)  # two values: say which ranks have which
        if odd and not same_point:  # nothing says the lines are one point of the program: name no rank
            return _apart(lines, ["odd" if j in odd else "usual" for j in range(len(lines))], first)
        if not _one_quantity([value for j, (_, (_, _, value)) in enumerate(column) if j not in odd]):
            return _apart(lines, [row[i][0] for row in numbers], first)  # too far apart to be noise: who has what
        shown, spread = _spread(column, odd)
        spreads += spread
        out += [shown, parts[i + 1]]
    if spreads > 1:  # two spreads side by side read as a mapping, lowest with lowest: keep the lines apart
        return _apart(lines, texts, first)
    return [([rank for rank, _ in lines], "".join(out))]


def _one_quantity(values: list[float]) -> bool:
    """The values are one quantity up to noise: all the same, or the lowest and the highest within
    ``REL_TOL`` of the larger magnitude."""
    low, high = min(values), max(values)
    return low == high or high - low <= REL_TOL * max(abs(low), abs(high))


def _apart(lines: list[tuple[int, str]], keys: list[str], first: bool = False) -> list[tuple[list[int], str]]:
    """The lines grouped by ``keys`` (one a line), each group folded on its own, by lowest rank."""
    groups: dict[str, list] = {}
    for line, key in zip(lines, keys):
        groups.setdefault(key, []).append(line)
    return sorted((out for group in groups.values() for out in _fold(group, first)), key=lambda out: out[0][0])


def _identifies(column: list[tuple[str, str, float]], ranks: list[int]) -> bool:
    """A number that tells the lines apart: a whole number without a unit or with ``%`` (a step, a count, an
    id, a progress), the rank itself, or a number that cannot be compared (not finite as written: ``1e400``).
    A value that differs on every line is not one by itself: whether it may be spread is the same question
    as where two ranks wrote the same (REL_TOL)."""
    if all(unit in ("", "%") and _WHOLE.fullmatch(text) for text, unit, _ in column):
        return True
    if not all(math.isfinite(value) for _, _, value in column):
        return True
    return all(value == rank for (_, _, value), rank in zip(column, ranks))


def _in_structure(parts: list[str], i: int) -> bool:
    """Number ``i`` is an element of a tensor, a list or a tuple, printed as it is: inside brackets, before a
    bracket that closes one opened on an earlier line (a wrapped tensor's last line), or next to another
    number with only a comma between (a wrapped tensor's middle line: ``0.5000, 0.6000,``) or only spaces
    (a numpy array's wrapped line ``0.923 1.    1.462``, a table's row ``1      1  2.350  0.920``)."""
    before, after = (_ANSI.sub("", "".join(side)) for side in (parts[:i + 1], parts[i + 1:]))  # ANSI's "[" is none
    opened = sum((c in "([{") - (c in ")]}") for c in before)
    closed = sum((c in ")]}") - (c in "([{") for c in after)
    listed = (i > 0 and parts[i].strip() == ",") or (i + 2 < len(parts) and parts[i + 1].strip() == ",")
    row = (i > 0 and _ROW.fullmatch(parts[i])) or (i + 2 < len(parts) and _ROW.fullmatch(parts[i + 1]))
    return opened > 0 or closed > 0 or listed or bool(row)


def _in_time(parts: list[str], i: int) -> bool:
    """Number ``i`` is part of a time or a date (``17:20:38,015``, ``2026-12-07``, ``12/07/2026``): it is
    joined to a neighbouring number by one of ``:,/-.``."""
    return (i > 0 and parts[i] in _JOINS) or (i + 2 < len(parts) and parts[i + 1] in _JOINS)


def standing_out(values: list[float], resolution: float = 0.0) -> list[int]:
    """The indexes of the values that stand out from the others. Among three values or more, a value stands
    out when it is more than ``resolution`` (one step of the precision the ranks wrote: a clock's tick,
    rounding) from the median, and

    - it is more than ``Z`` robust standard deviations from the median, by the modified z-score
      0.6745 × |x − median| / MAD (MAD: the median of the distances from the median), or,
    - where most values are the same (MAD 0, no spread to measure against), the values off it are at most a
      quarter of them (at least one): one odd rank of 4 or 8 is named, 3 of 8 are an uneven split.

    >>> standing_out([2.31, 2.31, 2.31, 2.91], resolution=0.01)
    [3]
    """
    if len(values) < 3 or not all(math.isfinite(v) for v in values):
        return []
    middle = statistics.median(values)
    distances = [abs(v - middle) for v in values]
    off = [i for i, d in enumerate(distances) if d > resolution * (1 + 1e-9)]  # 1.3 - 1.2 > 0.1 in floats
    mad = statistics.median(distances)
    if mad == 0:
        return off if len(off) <= max(1, len(values) // 4) else []
    return [i for i in off if 0.6745 * distances[i] / mad > Z]


def resolution(number: str) -> float:
    """One step in the last digit of a number as written: ``2.31`` 0.01, ``12`` 1, ``2.5E-2`` 0.001."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    digits = exponent.lstrip("+-")
    if len(digits) > 4:  # beyond any float's range (1e309 is inf, 1e-400 is 0): int() of 5000 digits even raises
        return math.inf if not exponent.startswith("-") else 0.0
    step = int(exponent or 0) - decimals
    return math.inf if step > 308 else 10.0 ** max(step, -400)


@functools.lru_cache(maxsize=1024)  # a line is split when it arrives (its shape) and again when it leaves
def _split(text: str) -> tuple[list[str], list[tuple[str, str, float]]]:
    """The text around the numbers (one more part than numbers), and each number's ``(text, unit, value)``.
    ANSI codes are text, and a number may start or end right at one."""
    parts, numbers, current = [], [], ""
    for i, piece in enumerate(_ANSI.split(text)):
        if i % 2:  # an ANSI code
            current += piece
            continue
        start = 0
        for match in _NUMBER.finditer(piece):
            parts.append(current + piece[start:match.start()])
            numbers.append((match["number"], match["unit"], float(match["number"])))
            current, start = "", match.end()
        current += piece[start:]
    parts.append(current)
    return parts, numbers


def _spread(column: list[tuple[int, tuple[str, str, float]]], odd: list[int]) -> tuple[str, bool]:
    """One number's place in the folded line: its value, or its spread over the ranks (True), and the ranks
    that stand out, named."""
    unit = column[0][1][1]
    usual = [number for i, (_, number) in enumerate(column) if i not in odd]
    low, high = min(usual, key=lambda n: n[2]), max(usual, key=lambda n: n[2])
    spread = low[0] != high[0]
    shown = f"{low[0]}{unit}{SPREAD}{high[0]}{unit}" if spread else f"{low[0]}{unit}"
    if odd:
        shown += " (" + ", ".join(f"rank {column[i][0]}: {column[i][1][0]}{unit}" for i in odd) + ")"
    return shown, spread
