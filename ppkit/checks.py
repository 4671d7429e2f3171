"""Checks of user input shared across the package (raise ``ConfigError``, never ``assert``)."""

from __future__ import annotations

import inspect

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
    """Refuse what is not a function, or one that cannot be called with ``signature``'s arguments
    (``"fn(rank, world_size, tensor)"``): a learner passed ``my_fn()`` or a wrong first line."""
    if not callable(fn):
        raise ConfigError(f"pass your function itself, {signature}, not {type(fn).__name__} {fn!r:.60}.")
    names = [n.strip() for n in signature[signature.index("(") + 1:signature.rindex(")")].split(",") if n.strip()]
    try:
        own = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature to read: let the call decide
        return
    try:
        own.bind(*names)
    except TypeError as err:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise ConfigError(
            f"the checker calls your function with {len(names)} argument(s), {signature}, but "
            f"{name}{own} cannot be called that way ({err}). Change its first line to take "
            f"({', '.join(names)}).") from None
