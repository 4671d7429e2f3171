"""What a tool's structured result states, as claims: facts the grader can hold against a program's truth.

Today's results name their facts in these fields: the doctor's ``Diagnosis`` (``groups``: per process group
the first call that does not match or that some ranks have not reached, ``deadlock``: pairs of ranks waiting
on each other), the parity tool's ``ParityReport`` (``equal``, ``first``: step, tensor, rank; ``diagnosis``:
what, why, check). Fields a newer tool may add are read with getattr and a default, so that an older result
grades as before: a finding's ``kind``, a call's ``api``/``api_seq`` (the learner's name and number for a call
the backend records otherwise), the doctor's ``cycles`` (waits of any length), ``unmatched`` p2p waits,
``unsure`` (it saw something and cannot tell) and ``notes`` (a difference that completed harmlessly: not a
claim of a problem), ``p2p_mismatched`` (a send and the recv the backend pairs with it, whose sizes or
dtypes differ: ``kind`` and ``calls`` by rank), the parity diagnosis's ``causes`` (ppkit.parity.causes'
identifiers) and ``unsure``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MISMATCH_WORDS = {"the op differs": "op_mismatch", "the sizes differ": "size_mismatch",
                  "the dtypes differ": "dtype_mismatch", "the reduce op differs": "reduce_op_mismatch",
                  "the root differs": "src_mismatch"}


@dataclass
class Claim:
    """One problem a tool states. ``ranks``: the ranks it names (for a mismatch, the ranks whose calls it
    compares; for "missing", those it says have not reached the call); ``ops``: the calls' names by rank (every
    name the result gives for a call); ``seq``: the call's number (the learner's where the result says it)."""
    kind: str
    ranks: frozenset[int] = frozenset()
    ops: dict[int, set[str]] = field(default_factory=dict)
    seq: int | None = None
    group_ranks: tuple[int, ...] | None = None
    step: int | None = None
    name: str | None = None
    causes: frozenset[str] = frozenset()


@dataclass
class Answer:
    """A tool's answer reduced to what the grader checks: its claims, and whether it said it cannot tell."""
    claims: list[Claim]
    unsure: bool = False
    error: str = ""  # the tool itself failed (raised)


def _call_names(call: dict) -> set[str]:
    return {name for name in (call.get("api"), call.get("api_op"), call.get("op")) if name}


def _call_seq(call: dict, default: int | None) -> int | None:
    if "api_seq" in call:
        return call["api_seq"]
    if call.get("api") and call["api"] != call.get("op"):
        return None  # the backend's number for a call it records as another op (the doctor says #N is its count)
    return default


def doctor_answer(diagnosis) -> Answer:
    if isinstance(diagnosis, BaseException):
        return Answer([], error=f"{type(diagnosis).__name__}: {diagnosis}")
    claims: list[Claim] = []
    for finding in getattr(diagnosis, "groups", []):
        calls = getattr(finding, "calls", {}) or {}
        ops = {r: _call_names(c) for r, c in calls.items()}
        seqs = {_call_seq(c, getattr(finding, "seq", None)) for c in calls.values()}
        seq = seqs.pop() if len(seqs) == 1 else None if None in seqs else getattr(finding, "seq", None)
        group_ranks = tuple(getattr(finding, "ranks", ()) or ()) or None
        mismatch = getattr(finding, "mismatch", "")
        kind = getattr(finding, "kind", None) or MISMATCH_WORDS.get(mismatch, "mismatch" if mismatch else "")
        if getattr(finding, "note_only", False) or getattr(finding, "harmless", False):
            continue  # a difference it reports as a harmless note, not as the problem
        if mismatch:
            claims.append(Claim(kind, frozenset(calls), ops, seq, group_ranks))
        elif getattr(finding, "missing", None):
            claims.append(Claim("missing", frozenset(finding.missing), ops, seq, group_ranks))
    p2p = getattr(diagnosis, "p2p", {}) or {}
    for pair in getattr(diagnosis, "deadlock", []) or []:
        claims.append(Claim("p2p_deadlock", frozenset(pair), {r: {p2p.get(r, {}).get("op", "")} for r in pair}))
    for cycle in getattr(diagnosis, "cycles", []) or []:
        if len(cycle) > 2 or frozenset(cycle) not in {c.ranks for c in claims if c.kind == "p2p_deadlock"}:
            claims.append(Claim("p2p_deadlock", frozenset(cycle), {r: {p2p.get(r, {}).get("op", "")} for r in cycle}))
    for pair in getattr(diagnosis, "p2p_mismatched", []) or []:
        claims.append(Claim(pair.kind, frozenset(pair.calls), {r: _call_names(c) for r, c in pair.calls.items()}))
    for wait in getattr(diagnosis, "unmatched", []) or []:
        ranks = wait if isinstance(wait, (tuple, list, set, frozenset)) else (wait,)
        claims.append(Claim("p2p_unmatched", frozenset(ranks)))
    unsure = bool(getattr(diagnosis, "unsure", False) or getattr(diagnosis, "cannot_tell", False)
                  # a rank without a record: it says whether that rank made the call is not known
                  or any(getattr(f, "unrecorded", None) for f in getattr(diagnosis, "groups", [])))
    return Answer(claims, unsure)


def parity_causes(diagnosis) -> frozenset[str]:
    """The causes the parity tool's finding names, by their identifiers (ppkit.parity.causes.CAUSES): its
    ``causes`` field, never its words (they are the learner's, and may change); none: {"unknown"}."""
    return frozenset(getattr(diagnosis, "causes", ()) or ()) or frozenset({"unknown"})


def parity_answer(report) -> Answer:
    if isinstance(report, BaseException):
        return Answer([], error=f"{type(report).__name__}: {report}")
    if report.equal:
        return Answer([], unsure=bool(getattr(report, "unsure", False)))
    first = report.first
    ranks = frozenset(d.rank for d in report.differences if d.step == first.step and d.name == first.name)
    causes = parity_causes(report.diagnosis)
    unsure = bool(getattr(report.diagnosis, "unsure", False)) or causes == {"unknown"}
    return Answer([Claim("wrong_numbers", ranks, step=first.step, name=first.name, causes=causes)], unsure)
