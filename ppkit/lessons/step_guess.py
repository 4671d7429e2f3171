"""Lesson 08b's predict-then-measure moments: the learner writes a guess in a variable before a measurement, and
the measuring cell says how far it was.

    compare(name, guess, measured)   one line: the guess against the measurement, or how to make one
"""

from __future__ import annotations

from numbers import Real


def compare(name: str, guess, measured: float, unit: str = "") -> str:
    """``guess`` (None: not written yet) against ``measured``: the ratio, and within what it is."""
    if guess is None:
        return f"{name}: no guess written (set it in the cell above, then run both again)"
    if not isinstance(guess, Real) or isinstance(guess, bool):
        return f"{name}: the guess should be a number, got {type(guess).__name__} {guess!r:.40}"
    shown = f"{guess:,.3g}{unit} against {measured:,.3g}{unit} measured"
    if measured == 0:
        return f"{name}: your guess {shown}"
    off = guess / measured - 1
    verdict = "within 10%" if abs(off) <= 0.10 else "within a factor of 2" if 0.5 <= guess / measured <= 2 else "off"
    return f"{name}: your guess {shown} ({off:+.0%}: {verdict})"
