"""Grade the collective doctor and the parity tool on the corpus: right, unsure, silent or false, per program and
entry point, by the facts of each tool's structured result (claims.py) against the program's truth (truth.py).

    python -m tests.bug_corpus.grade [--table] [--quick] [-k NAME] [--entries spawn,torchrun,cluster]

``--table`` writes the table into docs/debugging.md between its marker comments. Runs take about 10 minutes for
the whole corpus on two cores (each hang ends at its program's timeout); ``--quick`` runs the suite's fixed part.

- right: every problem it states holds (kind, ranks, call, number, group, step, tensor, cause, where the truth
  gives them), and it states one; or it states none where there is none to state (a correct program, a bug
  outside its record: truth.visible).
- unsure: it states no false fact, and says it saw something it cannot decide (or, for the parity tool, names
  the first difference correctly but no cause).
- silent: it states nothing about a bug its record can show.
- false: one of its claims contradicts the truth (a deadlock in a correct program, the wrong ranks, the wrong
  call, a cause that does not fit).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.bug_corpus.claims import Answer, Claim, doctor_answer, parity_answer
from tests.bug_corpus.truth import PROGRAMS, Program, Truth

CLASSES = ("right", "unsure", "silent", "false")
COLUMNS = ("spawn", "torchrun", "cluster", "on demand", "%%torchrun")  # the doctor's; parity has one column
BEGIN, END = "<!-- bug-corpus-table:begin -->", "<!-- bug-corpus-table:end -->"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "debugging.md"


@dataclass
class Grade:
    cls: str
    why: str = ""


@dataclass
class Row:
    program: Program
    grades: dict[str, Grade] = field(default_factory=dict)  # column -> grade ("parity" for the parity tool)
    unlike: list[str] = field(default_factory=list)  # entry points where the run did not end as its truth says


# truths whose program completes without an error (the others hang, or fail in a collective or on a rank)
COMPLETES = {"correct", "reduce_op_mismatch", "wrong_group", "wrong_numbers"}


def ended_as_stated(program: Program, outcome) -> bool:
    """A check of the corpus itself: a correct program must complete, a hang or a failed collective must not."""
    return (outcome.error is None) == (program.truth.kind in COMPLETES)


def claim_fits(claim: Claim, truth: Truth, tool: str) -> str:
    """'' when ``claim`` holds for a program whose truth is ``truth``, else what contradicts it."""
    if tool not in truth.visible and claim.kind != truth.kind:
        return f"it states {claim.kind} about a program whose problem ({truth.kind}) is not in its record"
    if truth.kind == "correct":
        return f"it states {claim.kind} (ranks {sorted(claim.ranks)}) about a correct program"
    if claim.kind != truth.kind and claim.kind not in truth.accept:
        return f"it states {claim.kind}, the truth is {truth.kind}"
    exact = claim.kind == truth.kind
    if exact and truth.ranks and claim.kind in ("missing", "p2p_deadlock", "p2p_unmatched", "wrong_numbers"):
        if claim.kind == "wrong_numbers" and not claim.ranks <= set(truth.ranks):
            return f"it names ranks {sorted(claim.ranks)}, the truth {list(truth.ranks)}"
        if claim.kind != "wrong_numbers" and claim.ranks != set(truth.ranks):
            return f"it names ranks {sorted(claim.ranks)}, the truth {list(truth.ranks)}"
    if exact and truth.ranks and claim.kind.endswith("_mismatch") and not set(truth.ranks) <= claim.ranks:
        return f"it compares ranks {sorted(claim.ranks)}, leaving out rank(s) {sorted(set(truth.ranks) - claim.ranks)}"
    if exact and truth.op and claim.ops and not any(_same_call(truth.op, name) for names in claim.ops.values()
                                                     for name in names):
        return f"it names the call(s) {sorted(set().union(*claim.ops.values()))}, the learner called {truth.op}"
    if exact and truth.seq is not None and claim.seq is not None and claim.seq != truth.seq:
        return f"it names call #{claim.seq}, the truth is the learner's call #{truth.seq}"
    if exact and truth.group_ranks and claim.group_ranks and tuple(claim.group_ranks) != truth.group_ranks:
        return f"it names the group of ranks {list(claim.group_ranks)}, the truth {list(truth.group_ranks)}"
    if truth.step is not None and claim.step is not None and claim.step != truth.step:
        return f"it names step {claim.step}, the truth is step {truth.step}"
    if truth.name and claim.name and claim.name != truth.name:
        return f"it names {claim.name}, the truth is {truth.name}"
    known = claim.causes - {"unknown"}
    if truth.causes and known and not known & set(truth.causes):
        return f"it gives the cause(s) {sorted(known)}, the truth fits {list(truth.causes)}"
    return ""


def _same_call(learner: str, named: str) -> bool:
    """The learner's call and a name the tool gives it: equal, or one the other's family (``all_gather`` for
    ``all_gather_into_tensor``, ``recv`` for ``irecv``); ``all_reduce`` for ``reduce_scatter`` is not."""
    return bool(named) and (learner in named or named in learner)


def classify(answer: Answer, truth: Truth, tool: str) -> Grade:
    for claim in answer.claims:
        wrong = claim_fits(claim, truth, tool)
        if wrong:
            return Grade("false", wrong)
    if answer.claims:
        if all(c.causes == {"unknown"} for c in answer.claims if c.kind == "wrong_numbers") and \
                any(c.kind == "wrong_numbers" for c in answer.claims):
            return Grade("unsure", "the first difference is right; no cause named")
        return Grade("right")
    quiet = truth.kind == "correct" or tool not in truth.visible
    if answer.error and quiet:  # it failed or refused: it said nothing false, and nothing either
        return Grade("unsure", answer.error)
    if answer.unsure:
        return Grade("unsure", "it says it cannot tell")
    if quiet:
        return Grade("right", "nothing to state" if truth.kind == "correct" else "outside its record, and quiet")
    return Grade("silent", answer.error)


def merge(answers: list[Answer]) -> Answer:
    return Answer([c for a in answers for c in a.claims], any(a.unsure for a in answers),
                  "; ".join(a.error for a in answers if a.error))


def grade_doctor(program: Program, outcome, column: str) -> Grade:
    shown = [s for s in outcome.shown if (s.where == "on demand") == (column == "on demand")]
    return classify(merge([doctor_answer(s.diagnosis) for s in shown]), program.truth, "doctor")


def grade_parity(program: Program, outcome) -> Grade:
    import ppkit

    if outcome.error is not None:
        return Grade("silent", f"the run failed: {type(outcome.error).__name__}")
    try:
        report = ppkit.compare_runs(program.reference(), outcome.result)
    except ppkit.PPKitError as exc:
        return classify(parity_answer(exc), program.truth, "parity")
    return classify(parity_answer(report), program.truth, "parity")


def run_program(program: Program, clusters, entries) -> Row:
    from tests.bug_corpus import run

    row = Row(program)
    if "parity" in program.tools:
        outcome = run.via_cluster(program, clusters, on_demand=False)
        row.grades["parity"] = grade_parity(program, outcome)
        row.unlike += [] if ended_as_stated(program, outcome) else ["cluster"]
    if "doctor" in program.tools:
        for entry in (e for e in program.entries if e in entries):
            if entry == "cluster":
                outcome = run.via_cluster(program, clusters)
                row.grades["cluster"] = grade_doctor(program, outcome, "cluster")
                row.grades["on demand"] = grade_doctor(program, outcome, "on demand")
            else:
                outcome = (run.via_spawn if entry == "spawn" else run.via_torchrun)(program)
                row.grades[entry] = grade_doctor(program, outcome, entry)
            if program.truth.kind != "not_collective" and not ended_as_stated(program, outcome):
                row.unlike.append(entry)
    return row


def grade_all(programs, entries=("spawn", "torchrun", "cluster"), echo=print) -> list[Row]:
    from tests.bug_corpus import run

    run.hang_seconds()
    clusters = run.Clusters()
    rows = {}
    try:  # by world size, so that each cluster starts once; the table keeps the corpus's order
        for program in sorted(programs, key=lambda p: p.world_size):
            started = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):  # what the ranks and the tools print
                row = rows[program.name] = run_program(program, clusters, entries)
            echo(f"{program.name}: " + ", ".join(f"{c} {g.cls}" + (f" ({g.why})" if g.cls != "right" and g.why
                                                                   else "") for c, g in row.grades.items())
                 + f"  [{time.monotonic() - started:.0f} s]"
                 + (f"  THE RUN DID NOT END AS ITS TRUTH SAYS under {row.unlike}" if row.unlike else ""))
    finally:
        clusters.close()
    return [rows[p.name] for p in programs if p.name in rows]


def add_kernel_grades(rows: list[Row], echo=print) -> None:
    """The %%torchrun column: the kernel's programs (kernel.KERNEL_PROGRAMS) among ``rows``, in one kernel."""
    from tests.bug_corpus.kernel import KERNEL_PROGRAMS, in_a_kernel

    by_name = {row.program.name: row for row in rows}
    names = [n for n in KERNEL_PROGRAMS if n in by_name]
    for name, grade in in_a_kernel(names).items():
        by_name[name].grades["%%torchrun"] = grade
        echo(f"{name}: %%torchrun {grade.cls}" + (f" ({grade.why})" if grade.cls != "right" and grade.why else ""))


def counts(rows: list[Row]) -> dict[str, Counter]:
    by_tool = {"doctor": Counter(), "parity": Counter()}
    for row in rows:
        for column, grade in row.grades.items():
            by_tool["parity" if column == "parity" else "doctor"][grade.cls] += 1
    return by_tool


def _truth_words(truth: Truth) -> str:
    if truth.kind == "correct":
        return "correct"
    facts = [f"ranks {','.join(map(str, truth.ranks))}" if truth.ranks else "",
             f"{truth.op}" + (f" #{truth.seq}" if truth.seq else "") if truth.op else "",
             f"step {truth.step}" if truth.step is not None else ""]
    return f"{truth.kind} ({'; '.join(f for f in facts if f)})" if any(facts) else truth.kind


def table(rows: list[Row]) -> str:
    head = "| program | ranks | truth | " + " | ".join(f"doctor: {c}" for c in COLUMNS) + " | parity |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        cells = [row.grades[c].cls if c in row.grades else "" for c in (*COLUMNS, "parity")]
        lines.append(f"| `{row.program.name}` | {row.program.world_size} | {_truth_words(row.program.truth)} | "
                     + " | ".join(cells) + " |")
    totals = counts(rows)
    lines.append("")
    for tool, counter in totals.items():
        total = sum(counter.values())
        lines.append(f"- **{tool}** ({total} answers): " + ", ".join(f"{counter[c]} {c}" for c in CLASSES))
    return "\n".join(lines)


def write_table(text: str, path: Path = DOCS) -> None:
    doc = path.read_text()
    block = f"{BEGIN}\n{text}\n{END}"
    if BEGIN in doc and END in doc:
        doc = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(doc)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bug_corpus.grade", description=__doc__.split("\n")[0])
    parser.add_argument("--table", action="store_true", help="write the table into docs/debugging.md")
    parser.add_argument("--quick", action="store_true", help="only the suite's fixed part (Program.quick)")
    parser.add_argument("-k", default="", help="only programs whose name contains this")
    parser.add_argument("--entries", default="spawn,torchrun,cluster", help="entry points, comma-separated")
    parser.add_argument("--kernel", action="store_true",
                        help="also %%%%torchrun in a Jupyter kernel, for the programs of kernel.KERNEL_PROGRAMS")
    args = parser.parse_args(argv)
    os.environ.setdefault("PPKIT_SHARED_MACHINE", "1")
    import tests.bug_corpus  # noqa: F401 (registers the programs)

    programs = [p for p in PROGRAMS if (p.quick or not args.quick) and args.k in p.name]
    echo = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    rows = grade_all(programs, tuple(args.entries.split(",")), echo=echo)
    if args.kernel:
        add_kernel_grades(rows, echo)
    text = table(rows)
    print(text)
    if args.table:
        write_table(text)
        print(f"written into {DOCS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
