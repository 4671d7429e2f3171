"""Checks of user input shared across the package (raise ``ConfigError``, never ``assert``)."""

from __future__ import annotations

import difflib
import inspect
import math

from ppkit.errors import ConfigError


def positive(value, name: str, what: str = "a positive number of seconds") -> float:
    """``value`` as a float if it is a finite number above 0 (``True``, nan and inf are refused).

    >>> positive(2, "timeout")
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{name} must be {what}, got {value!r}; write a finite number above 0, e.g. {name}=30.")
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


def check_keywords(fn, call: str, args: tuple, options: dict) -> None:
    """Refuse keywords that ``fn`` does not take, naming the closest one it does (a typo such as
    ``timeout_s=`` in a second ``ppkit.start`` must not cost the learner a working cluster)."""
    params = inspect.signature(fn).parameters
    takes = [n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "self"]
    for name in options:
        if name not in takes:
            close = difflib.get_close_matches(name, takes, n=1)
            hint = f"did you mean {close[0]}=? " if close else ""
            raise ConfigError(
                f"{call} has no option {name!r}; {hint}It takes: {', '.join(takes)}. "
                "Nothing was started or stopped.")
    try:
        inspect.signature(fn).bind(*args, **options)
    except TypeError as err:
        raise ConfigError(f"{call} cannot be called that way: {err}. It takes: {', '.join(takes)}.") from None


def check_env(env) -> dict[str, str] | None:
    """``env`` for the workers: a mapping of names to strings, as ``os.environ`` holds them."""
    if env is None:
        return None
    if not isinstance(env, dict):
        raise ConfigError(f"env must be a dict of variable names to strings, e.g. env={{'OMP_NUM_THREADS': '1'}}, "
                          f"got {type(env).__name__}.")
    bad = {k: v for k, v in env.items() if not isinstance(k, str) or not k or "=" in k or not isinstance(v, str)}
    if bad:
        fixed = ", ".join(f"{k!r}: {str(v)!r}" for k, v in list(bad.items())[:3])
        raise ConfigError(
            f"env values must be strings, as in os.environ (a worker cannot set a variable to "
            f"{type(next(iter(bad.values()))).__name__}): got {bad!r}. Write them as text, e.g. {{{fixed}}}.")
    return dict(env)


def check_labels(labels, count: int) -> list[str] | None:
    """One text label per rank (how each rank's output is prefixed), or None for "rank N"."""
    if labels is None:
        return None
    if isinstance(labels, str) or not isinstance(labels, (list, tuple)) \
            or not all(isinstance(x, str) for x in labels) or len(labels) != count:
        raise ConfigError(
            f"labels must be a list of {count} strings, one per rank, to prefix each rank's output (e.g. "
            f"{[f'rank {r}' for r in range(min(count, 3))]}{'...' if count > 3 else ''}), got {labels!r}.")
    return list(labels)


def check_port(port, name: str, lowest: int = 1) -> int:
    """A TCP port number from ``lowest`` (0 = any free port) to 65535."""
    if isinstance(port, bool) or not isinstance(port, int) or not lowest <= port <= 65535:
        raise ConfigError(f"{name} must be a port from {lowest} to 65535, got {port!r}.")
    return port
