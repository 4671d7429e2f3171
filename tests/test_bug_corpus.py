"""The collective doctor and the parity tool, graded on the fixed part of the bug corpus (tests/bug_corpus/,
the 19 programs marked quick=True: correct and buggy collectives, p2p, groups, DDP, FSDP2, a hand-written
pipeline, and the parity tool on data parallel in fp32 and bf16 autocast): each program runs through
ppkit.spawn, ppkit.torchrun and Cluster.run (then ppkit.collective_doctor on demand), and no answer may state a
falsehood.

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
    assert classify(Answer([], error="ClusterStateError: ..."), CORRECT, "doctor").cls == "unsure"


def test_the_grader_reads_the_parity_tools_facts():
    """A skipped update on rank 1: the first difference is the loss at step 2 on both ranks (averaged over them);
    a cause that does not fit is false, no cause is unsure, the right one is right."""
    truth = Truth("wrong_numbers", ranks=(0, 1), step=2, causes=("skipped_step",))
    first = Claim("wrong_numbers", frozenset({0, 1}), step=2, name="loss", causes=frozenset({"skipped_step"}))
    assert classify(Answer([first]), truth, "parity").cls == "right"
    unknown = Claim("wrong_numbers", frozenset({0, 1}), step=2, name="loss", causes=frozenset({"unknown"}))
    assert classify(Answer([unknown]), truth, "parity").cls == "unsure"
    blamed = Claim("wrong_numbers", frozenset({0, 1}), step=2, name="loss", causes=frozenset({"sum_not_mean"}))
    assert classify(Answer([blamed]), truth, "parity").cls == "false"
    late = Claim("wrong_numbers", frozenset({0, 1}), step=3, name="loss", causes=frozenset({"skipped_step"}))
    assert classify(Answer([late]), truth, "parity").cls == "false"
    assert classify(Answer([]), truth, "parity").cls == "silent"
    assert classify(Answer([first]), CORRECT, "parity").cls == "false"  # a false alarm


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


def test_the_grader_reads_the_doctors_diagnosis():
    """claims.py against the doctor's own result type: a mismatch, a rank that has not reached a call, a deadlock."""
    from ppkit.cluster.hang_doctor.analysis import Diagnosis, GroupFinding
    from tests.bug_corpus.claims import doctor_answer

    call = {"op": "all_reduce", "seq": 2, "done": False}
    sizes = GroupFinding("0", "default_pg", [0, 1], None, 1, {0: call, 1: call}, mismatch="the sizes differ")
    skipped = GroupFinding("1", "", [0, 1], (1, "all_reduce"), 2, {0: call}, missing={1: "it finished its job"})
    claims = doctor_answer(Diagnosis([sizes, skipped], {}, [(0, 1)], {}, [], [])).claims
    assert [(c.kind, sorted(c.ranks), c.seq) for c in claims] == [
        ("size_mismatch", [0, 1], 1), ("missing", [1], 2), ("p2p_deadlock", [0, 1], None)]
    assert claims[1].ops == {0: {"all_reduce"}} and claims[1].group_ranks == (0, 1)


def test_the_grader_reads_every_cause_the_parity_tools_finding_names():
    """The grader reads the finding's causes field, every identifier in it (a loss not divided over micro-batches
    fits three: the accumulation must be read, not only the first), never its words: words that name a cause
    without the field grade as no cause."""
    from ppkit.parity.case import Diagnosis
    from tests.bug_corpus.claims import parity_causes

    why = ("3 causes fit: a data-parallel all_reduce that summed where it should average (the loss was averaged "
           "over 2 ranks, mean_over=, and a sum over 2 data-parallel ranks is 2x); gradient accumulation over 2 "
           "micro-batches whose losses were not divided by 2 (each backward adds its whole gradient); a loss 2x "
           "the reference's before backward (summed where the reference takes a mean)")
    three = Diagnosis("the gradient is 2x the reference on every rank", why, "...",
                      causes=("sum_not_mean", "accumulation", "loss_scale"))
    assert parity_causes(three) == {"sum_not_mean", "accumulation", "loss_scale"}
    assert parity_causes(Diagnosis("the loss differs", why, "...", shaped=False)) == {"unknown"}
