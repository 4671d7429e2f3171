"""Lines of several ranks that differ only in their numbers, shown as one line that says where they
differ: ``step 10 loss 2.31…2.35 (rank 5: 2.91)``, read as: every rank not named wrote a loss from 2.31
to 2.35, rank 5 wrote 2.91, and every other number is what each rank wrote.

A line's ``shape`` is its text with its numbers taken out (``step # loss #``); lines of one shape meet
(collapse.py decides which), and ``fold`` shows them as one line only where that line is true of every
rank and cannot be read as something else. Otherwise the lines stay apart, grouped by the number that
keeps them apart (each group folded again), one line per group with its ranks:

- a number that says which line is which is never spread: a whole number without a unit (a step, an
  epoch, a count: ``step 3`` never joins ``step 8``), the rank itself, or a value that differs on every
  rank (each rank's own, a scatter's piece);
- a number inside brackets (a tensor's, a list's or a tuple's printed form, a wrapped tensor's lines) or in
  a time or a date (``17:20:38,015``, ``2026-12-07``) is kept as written, so a log parser still reads the line;
- a number with two values that names no rank is said of the ranks of each: ``[ranks 0-1] loss 2.31``
  and ``[ranks 2-3] loss 7.5``, not ``loss 2.31…7.5``;
- at most one number of a line is spread (two spreads side by side read as lowest with lowest).

A spread is the lowest ``…`` the highest, as the ranks wrote them. A rank that stands out is named with its
value outside the spread (``standing_out``; a difference of one step in the last digit written names no
rank). A word that differs keeps lines apart: ``nan`` against ``2.31``, ``ms`` against ``s``.

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


def fold(lines: list[tuple[int, str]]) -> list[tuple[list[int], str]]:
    """``(rank, text)`` lines of one shape as ``(ranks, text)`` lines, in the order of their lowest rank:
    one line where the numbers may be folded (the module's docstring), else one for each group of ranks
    that wrote the same."""
    return _fold(sorted(lines))


def _fold(lines: list[tuple[int, str]]) -> list[tuple[list[int], str]]:
    texts = [text for _, text in lines]
    if all(text == texts[0] for text in texts):
        return [([rank for rank, _ in lines], texts[0])]
    parts, _ = _split(texts[0])
    numbers = [_split(text)[1] for text in texts]
    varying = [i for i in range(len(numbers[0])) if len({row[i][0] for row in numbers}) > 1]
    for i in varying:  # a number that says which line is which: the lines stay apart, by its value
        column = [row[i] for row in numbers]
        if _in_structure(parts, i) or _in_time(parts, i) or _identifies(column, [rank for rank, _ in lines]):
            return _apart(lines, [row[i][0] for row in numbers])
    spreads, out = 0, [parts[0]]
    for i in range(len(numbers[0])):
        column = [(rank, row[i]) for (rank, _), row in zip(lines, numbers)]
        odd = standing_out([value for _, (_, _, value) in column],
                           resolution=max(resolution(text) for _, (text, _, _) in column))
        if i in varying and not odd and len({text for _, (text, _, _) in column}) == 2:
            return _apart(lines, [row[i][0] for row in numbers])  # two values: say which ranks have which
        shown, spread = _spread(column, odd)
        spreads += spread
        out += [shown, parts[i + 1]]
    if spreads > 1:  # two spreads side by side read as a mapping, lowest with lowest: keep the lines apart
        return _apart(lines, texts)
    return [([rank for rank, _ in lines], "".join(out))]


def _apart(lines: list[tuple[int, str]], keys: list[str]) -> list[tuple[list[int], str]]:
    """The lines grouped by ``keys`` (one a line), each group folded on its own, by lowest rank."""
    groups: dict[str, list] = {}
    for line, key in zip(lines, keys):
        groups.setdefault(key, []).append(line)
    return sorted((out for group in groups.values() for out in _fold(group)), key=lambda out: out[0][0])


def _identifies(column: list[tuple[str, str, float]], ranks: list[int]) -> bool:
    """A number that tells the lines apart: a whole number without a unit (a step, a count, an id), the rank
    itself, or a value that differs on every line (each rank's own: a scatter's piece)."""
    if all(unit == "" and _WHOLE.fullmatch(text) for text, unit, _ in column):
        return True
    if all(value == rank for (_, _, value), rank in zip(column, ranks)):
        return True
    return len({text + unit for text, unit, _ in column}) == len(column)


def _in_structure(parts: list[str], i: int) -> bool:
    """Number ``i`` is an element of a tensor, a list or a tuple, printed as it is: inside brackets, before a
    bracket that closes one opened on an earlier line (a wrapped tensor's last line), or next to another
    number with only a comma between (a wrapped tensor's middle line: ``0.5000, 0.6000,``)."""
    before, after = (_ANSI.sub("", "".join(side)) for side in (parts[:i + 1], parts[i + 1:]))  # ANSI's "[" is none
    opened = sum((c in "([{") - (c in ")]}") for c in before)
    closed = sum((c in ")]}") - (c in "([{") for c in after)
    listed = (i > 0 and parts[i].strip() == ",") or (i + 2 < len(parts) and parts[i + 1].strip() == ",")
    return opened > 0 or closed > 0 or listed


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
    return 10.0 ** (int(exponent or 0) - decimals)


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
