"""A corpus program and its truth, as data.

A ``Truth`` states what is wrong with a program as facts a tool's structured answer can be checked against:
the kind of bug, the ranks at fault, the learner's call (its torch.distributed name and its number among the
learner's calls in that process group, from 1), the training step, or ``"correct"``. A field left None is not
checked. ``accept`` lists other kinds whose claims are also true of this program (a rank that skips an
all_reduce and then calls broadcast leaves the two ranks' call #2 with different ops: both are facts).
``visible`` names the tools whose record can show this bug at all: where it is empty for a tool, that tool's
right answer is to say nothing about it, or that it cannot tell.

To grade a new fact of a tool's answer, add a field here, set it on the programs where it is known, and
compare it in grade.py's matcher for that tool: programs that leave it None are not affected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# the kinds of bug, and which tool's record can show each one
DOCTOR_KINDS = {
    "op_mismatch",        # the ranks' calls at one sequence number are different collectives
    "size_mismatch",      # same collective, different sizes (or split sizes)
    "dtype_mismatch",     # same collective, different dtypes
    "missing",            # some ranks never reach a collective the others wait in (skipped, exited, raised)
    "p2p_deadlock",       # a cycle of send/recv waits (two ranks or a ring)
    "p2p_unmatched",      # a send or recv whose peer never makes the matching call (wrong peer, wrong tag)
    "group_order",        # ranks wait in different process groups, each for a rank that waits in the other
    "reduce_op_mismatch", # same collective, different reduce ops (the record keeps the op= each rank passed)
    "src_mismatch",       # same rooted collective, different src/dst (the record keeps the root each rank passed)
}
PARITY_KINDS = {"wrong_numbers"}
INVISIBLE_KINDS = {"not_collective", "wrong_group"}


@dataclass(frozen=True)
class Truth:
    kind: str                                  # "correct", or one of the kinds above
    ranks: tuple[int, ...] = ()                # the ranks at fault (parity: whose records differ first; a loss
                                               # averaged over ranks differs on every one of them)
    op: str | None = None                      # the learner's call: "all_reduce", "recv", ...
    seq: int | None = None                     # its number among the learner's calls in its group, from 1
    group_ranks: tuple[int, ...] | None = None  # the process group it was called on, by its ranks
    step: int | None = None                    # parity: the first step that differs
    name: str | None = None                    # parity: the first tensor that differs ("loss" for the loss)
    causes: tuple[str, ...] = ()               # parity: the causes that fit (grade.py's cause tags)
    accept: tuple[str, ...] = ()               # other kinds whose claims are true of this program too
    visible: tuple[str, ...] = ("doctor", "parity")  # tools whose record can show it


@dataclass(frozen=True)
class Program:
    """One corpus program: ``fn(rank, world_size)`` runs on every rank of a gloo world that exists already
    (the grader makes it: Cluster.run's, or init_process_group in ppkit.spawn / ppkit.torchrun)."""
    name: str
    fn: Callable
    world_size: int
    truth: Truth
    source: str                                # where the case comes from (an issue item, a URL, a torch test)
    tools: tuple[str, ...] = ("doctor",)       # "doctor" and/or "parity"
    entries: tuple[str, ...] = ("cluster", "spawn", "torchrun")
    timeout: float = 6.0                       # a hang ends as a JobTimeoutError after this many seconds
                                               # (a correct program's default: 30 s, room for a loaded machine)
    reference: Callable | None = None          # parity: the one-process reference, a ParityRun
    quick: bool = False                        # in the suite's fixed part (tests/test_bug_corpus.py)
    tags: tuple[str, ...] = field(default_factory=tuple)


PROGRAMS: list[Program] = []


def program(world_size: int, truth: Truth, source: str, **options):
    """Register the decorated ``fn(rank, world_size)`` as a corpus program."""
    def register(fn):
        if truth.kind not in {"correct"} | DOCTOR_KINDS | PARITY_KINDS | INVISIBLE_KINDS:
            raise ValueError(f"{fn.__name__}: unknown kind {truth.kind!r}")
        options.setdefault("timeout", 30.0 if truth.kind == "correct" else 6.0)
        PROGRAMS.append(Program(fn.__name__, fn, world_size, truth, source, **options))
        return fn
    return register


CORRECT = Truth("correct")
