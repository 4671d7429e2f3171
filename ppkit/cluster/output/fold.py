"""Lines of several ranks that differ only in their numbers, shown as one line that says where they
differ: ``step 10 loss 2.31…2.35 (rank 5: 2.91)``.

A line's ``shape`` is its text with its numbers taken out (``step # loss #``); lines of one shape fold
(collapse.py decides which lines meet). Each number that differs between them shows its spread, lowest
``…`` highest, as each rank wrote it, and a rank that stands out is named with its value, outside the
spread (``standing_out``; a difference of one step in the last digit written names no rank). A word
that differs keeps lines apart: ``nan`` against ``2.31``, ``ms`` against ``s``.

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


def fold(lines: list[tuple[int, str]]) -> str:
    """One line for ``(rank, text)`` lines of one shape, in rank order."""
    texts = [text for _, text in lines]
    if all(text == texts[0] for text in texts):
        return texts[0]
    split = [_split(text) for text in texts]
    parts = split[0][0]
    out = [parts[0]]
    for i in range(len(split[0][1])):
        out.append(_spread([(rank, numbers[i]) for (rank, _), (_, numbers) in zip(lines, split)]))
        out.append(parts[i + 1])
    return "".join(out)


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


def _spread(column: list[tuple[int, tuple[str, str, float]]]) -> str:
    """One number's place in the folded line: its spread over the ranks, and the ranks that stand out."""
    unit = column[0][1][1]
    odd = standing_out([value for _, (_, _, value) in column],
                       resolution=max(resolution(text) for _, (text, _, _) in column))
    usual = [number for i, (_, number) in enumerate(column) if i not in odd]
    low, high = min(usual, key=lambda n: n[2]), max(usual, key=lambda n: n[2])
    shown = f"{low[0]}{unit}" if low[2] == high[2] else f"{low[0]}{unit}{SPREAD}{high[0]}{unit}"
    if odd:
        shown += " (" + ", ".join(f"rank {column[i][0]}: {column[i][1][0]}{unit}" for i in odd) + ")"
    return shown
