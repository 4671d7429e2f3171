"""For checkers whose exercise a lesson function already answers: call the learner's function with that lesson's
answers swapped out, so that calling them is a finding ("you called the answer"), not a pass.

    call_refusing(fn, args, module, names, why)   fn(*args) while each ``module.<name>`` raises LessonFormulaUsed
"""

from __future__ import annotations


class LessonFormulaUsed(Exception):
    """Raised inside the learner's function when it calls a lesson function that is the exercise's answer."""


def call_refusing(fn, args: tuple, module, names, why: str):
    """``fn(*args)`` with ``module``'s ``names`` replaced by functions that raise ``LessonFormulaUsed``: "called
    <module short name>.<name>, <why>"; the originals are put back however ``fn`` ends."""
    short = module.__name__.rsplit(".", 1)[-1]

    def refuse(name):
        def refused(*_args, **_kwargs):
            raise LessonFormulaUsed(f"your function called {short}.{name}, {why}")
        return refused

    saved = {name: getattr(module, name) for name in names}
    try:
        for name in names:
            setattr(module, name, refuse(name))
        return fn(*args)
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
