"""The collective doctor and the parity tool, graded on the fixed part of the bug corpus (tests/bug_corpus/,
the programs marked quick=True: correct and buggy collectives, p2p, groups, DDP, FSDP2, a hand-written
pipeline, and the parity tool on data parallel): each program runs through ppkit.spawn, ppkit.torchrun and
Cluster.run (then ppkit.collective_doctor on demand), and no answer may state a falsehood.

The whole corpus: ``python -m tests.bug_corpus.grade --table`` (docs/debugging.md's table).
"""

from __future__ import annotations

import pytest

from tests.bug_corpus import PROGRAMS
from tests.bug_corpus.claims import Answer, Claim
from tests.bug_corpus.grade import Grade, classify, counts, grade_all, table
from tests.bug_corpus.truth import CORRECT, Truth

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_grader_sorts_claims_by_their_facts():
    """The grader itself: a claim is false when one of its facts contradicts the truth, whatever its words."""
    skip = Truth("missing", ranks=(1,), op="all_reduce", seq=2)
    said = Claim("missing", frozenset({1}), {0: {"all_reduce"}}, seq=2)
    assert classify(Answer([said]), skip, "doctor") == Grade("right")
    wrong_rank = Claim("missing", frozenset({0}), {1: {"all_reduce"}}, seq=2)
    assert classify(Answer([wrong_rank]), skip, "doctor").cls == "false"
    wrong_seq = Claim("missing", frozenset({1}), {0: {"all_reduce"}}, seq=1)
    assert classify(Answer([wrong_seq]), skip, "doctor").cls == "false"
    assert classify(Answer([]), skip, "doctor").cls == "silent"
    assert classify(Answer([], unsure=True), skip, "doctor").cls == "unsure"
    deadlock = Claim("p2p_deadlock", frozenset({0, 1}))
    assert classify(Answer([deadlock]), CORRECT, "doctor").cls == "false"
    assert classify(Answer([]), CORRECT, "doctor").cls == "right"
    invisible = Truth("reduce_op_mismatch", ranks=(1,), visible=())
    assert classify(Answer([]), invisible, "doctor").cls == "right"


def test_no_false_answer_on_the_corpus_quick_part(capsys):
    programs = [p for p in PROGRAMS if p.quick]
    lines: list[str] = []
    rows = grade_all(programs, echo=lines.append)
    totals = counts(rows)
    with capsys.disabled():
        print("\n" + table(rows))
    false = [line for line in lines if " false" in line]
    assert not any(grade.cls == "false" for row in rows for grade in row.grades.values()), (
        f"{sum(c['false'] for c in totals.values())} false answer(s) "
        f"(doctor {dict(totals['doctor'])}, parity {dict(totals['parity'])}):\n" + "\n".join(false))
