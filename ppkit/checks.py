"""Checks of user input shared across the package (raise ``ConfigError``, never ``assert``)."""

from __future__ import annotations

from ppkit.errors import ConfigError


def positive(value, name: str, what: str = "a positive number of seconds") -> float:
    """``value`` as a float if it is a number above 0 (``True`` is not a number here).

    >>> positive(2, "timeout")
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name} must be {what}, got {value!r}.")
    return float(value)


def check_callable(fn, signature: str) -> None:
    """A learner passed ``my_fn()`` (its result) where ``my_fn`` itself was wanted."""
    if not callable(fn):
        raise ConfigError(f"pass your function itself, {signature}, not {type(fn).__name__} {fn!r:.60}.")
