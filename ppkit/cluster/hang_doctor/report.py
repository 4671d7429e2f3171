"""The doctor's diagnosis in plain words (analysis.Diagnosis)."""

from __future__ import annotations

import os
import sys

from ppkit.cluster.output.settings import rank_ranges


def sizes_words(sizes) -> str:
    return ", ".join(str(list(s)) for s in sizes) or "no tensor"


def call_words(call: dict, with_group: bool = False) -> str:
    """'all_reduce #3 of [4] Float, called at <cell> line 7: dist.all_reduce(t)'."""
    dtypes = "/".join(sorted(set(call["input_dtypes"]))) if call["input_sizes"] else ""
    where = f" of group {call['group']}" if with_group else ""
    return (f"{call['op']} #{call['seq']}{where} of {sizes_words(call['input_sizes'])}"
            f"{' ' + dtypes if dtypes else ''}{line_words(call.get('at'), 'called ')}")


def line_words(at: dict | None, verb: str = "") -> str:
    """', called at Cell In[4], line 5: dist.all_reduce(t)'."""
    if not at:
        return ""
    return f", {verb}at {place(at['file'])}, line {at['line']}" + (f": {at['code']}" if at.get("code") else "")


def place(filename: str) -> str:
    """A learner's file as they know it: a notebook cell as IPython names it in tracebacks ('Cell In[4]',
    not the kernel's temporary file), a magic's cell ('%%torchrun cell 2'), a file's own name."""
    if filename.startswith("<%%") and filename.endswith(">"):
        return filename[1:-1]
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    try:
        named = shell.compile.format_code_name(filename) if shell is not None else None
    except Exception:  # noqa: BLE001 - an IPython without it: the file's name serves
        named = None
    if named:
        return " ".join(named)
    return filename if filename.startswith("<") else os.path.basename(filename)


def group_words(finding) -> str:
    desc = "the default group" if finding.desc == "default_pg" else (finding.desc or "")
    desc = "" if desc == "undefined" else desc
    return f"group {finding.name} ({desc + ', ' if desc else ''}ranks {finding.ranks})"


def explain(diagnosis) -> str:
    lines = ["[ppkit] collective doctor (torch's flight record of each rank):"]
    if diagnosis.source:
        lines.append(f"  ({diagnosis.source})")
    waiting_groups = {g.name for g in diagnosis.groups if g.missing and not g.mismatch}
    if len(waiting_groups) > 1:
        lines.append(f"  the ranks wait in different process groups ({', '.join(sorted(waiting_groups))}): "
                     "each waits for the others in a group they never call this collective on.")
    for finding in diagnosis.groups:
        lines.append(f"  {group_words(finding)}: " + (
            f"every rank that answered completed collective #{finding.last_done[0]} ({finding.last_done[1]})."
            if finding.last_done else "no collective completed on every rank yet."))
        verdict = (f"collective #{finding.seq} does not match: {finding.mismatch}" if finding.mismatch else
                   f"collective #{finding.seq} is not reached by every rank" if finding.missing else
                   f"collective #{finding.seq} has not completed on every rank" if finding.unrecorded else
                   f"collective #{finding.seq} is called by every rank and has not completed yet")
        lines.append(f"    {verdict}:")
        for ranks, words in _alike(finding.calls):
            lines.append(f"      {'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)}: {words}")
        if finding.mismatch and all(call["done"] for call in finding.calls.values()):
            lines.append("      (it completed on every rank anyway: the data it moved is wrong)")
        for rank, where in sorted(finding.missing.items()):
            lines.append(f"      rank {rank} has not reached it: {where}")
        for rank, how in sorted(finding.unrecorded.items()):
            lines.append(f"      rank {rank}: no record: {how}; whether it called collective #{finding.seq} "
                         "is not known")
        if finding.mismatch and _skipped(finding):
            lines.append("      (a barrier against another collective: one rank skipped a collective the other calls)")
        if finding.torch_says:
            lines.append(f"      torch's matcher: {finding.torch_says}")
    for rank, wait in sorted(diagnosis.p2p.items()):
        peer = wait.get("peer")
        lines.append(f"  rank {rank} waits in {wait['op']} {'to' if 'send' in wait['op'] else 'from'} "
                     f"rank {peer} of {sizes_words(wait.get('sizes', []))} {wait.get('dtype', '')}"
                     f"{line_words(wait.get('at'))}")
    for a, b in diagnosis.deadlock:
        lines.append(f"  ranks {a} and {b} each wait on the other: rank {a}'s {diagnosis.p2p[a]['op']} needs a "
                     f"matching call on rank {b}, which is itself in {diagnosis.p2p[b]['op']}. "
                     "Order them: one rank sends first while the other receives.")
    for rank, record in sorted(diagnosis.records.items()):
        if record.get("error"):
            lines.append(f"  rank {rank}'s record is incomplete: {record['error']}")
    if diagnosis.unanswered:
        lines.append(f"  rank(s) {diagnosis.unanswered} sent no record (stopped, or gone).")
    if diagnosis.off:
        lines.append(f"  rank(s) {diagnosis.off} record nothing: TORCH_FR_BUFFER_SIZE=0 turned the recorder off.")
    if len(lines) == 1 + bool(diagnosis.source):
        lines.append("  every collective each rank started has completed on every rank that answered.")
    return "\n".join(lines) + "\n"


def _alike(calls: dict[int, dict]) -> list[tuple[list[int], str]]:
    """Ranks whose calls read the same, one line each (at 8 ranks, the one that differs stands out)."""
    by_words: dict[str, list[int]] = {}
    for rank, call in sorted(calls.items()):
        by_words.setdefault(call_words(call), []).append(rank)
    return [(ranks, words) for words, ranks in by_words.items()]  # by each one's first rank, as inserted


def _skipped(finding) -> bool:
    ops = {call["op"] for call in finding.calls.values()}
    return len(ops) > 1 and "barrier" in ops
