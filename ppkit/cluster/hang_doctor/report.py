"""The doctor's diagnosis in plain words (analysis.Diagnosis)."""

from __future__ import annotations

from ppkit.cluster.hang_doctor.words import call_words, line_words, p2p_words, pair, renamed, sizes_words
from ppkit.cluster.output.settings import rank_ranges


def group_words(finding) -> str:
    desc = "the default group" if finding.desc == "default_pg" else (finding.desc or "")
    desc = "" if desc == "undefined" else desc
    backend = f"{finding.backend}, " if finding.backend else ""  # a group of two backends: each counts its own
    return f"group {finding.name} ({backend}{desc + ', ' if desc else ''}ranks {finding.ranks})"


def explain(diagnosis) -> str:
    lines = ["[ppkit] collective doctor (torch's flight record of each rank):"]
    if diagnosis.source:
        lines.append(f"  ({diagnosis.source})")
    for name, view in sorted(diagnosis.views.items()):
        said = ", ".join(f"rank {rank_ranges(ranks)} says {list(members)}" if len(ranks) == 1 else
                         f"ranks {rank_ranges(ranks)} say {list(members)}"
                         for members, ranks in sorted(view["seen"].items(), key=lambda kv: kv[1]))
        lines.append(f"  the ranks disagree on the members of group {name}: {said}. torch names groups in the order "
                     "they are created: create them in the same order on every rank (each new_group on every rank, "
                     f"member or not). Below, group {name}'s members are as rank {view['shown']} sees them.")
    waiting_groups = {g.name for g in diagnosis.groups if g.missing and not g.mismatch
                      and all(diagnosis.blocked(r) and _waits_elsewhere(diagnosis.records.get(r), g.name)
                              for r in g.missing)}  # a rank in its own code, or in new_group, waits in no group
    if len(waiting_groups) > 1:
        lines.append(f"  the ranks wait in different process groups ({', '.join(sorted(waiting_groups))}): "
                     "each waits for the others in a group they never call this collective on.")
    headed = set()
    for finding in diagnosis.groups:
        if (finding.name, finding.backend) not in headed:
            headed.add((finding.name, finding.backend))
            lines.append(f"  {group_words(finding)}: " + (
                f"every rank that answered completed collective #{finding.last_done[0]} ({finding.last_done[1]})."
                if finding.last_done else "no collective completed on every rank yet."))
        verdict = (f"note: collective #{finding.seq} completed on every rank, though the shapes differ (each rank "
                   "gave the same number of elements)" if finding.harmless else
                   f"collective #{finding.seq} does not match: {finding.mismatch}" if finding.mismatch else
                   f"collective #{finding.seq} is not reached by every rank" if finding.missing else
                   f"collective #{finding.seq} has not completed on every rank" if finding.unrecorded else
                   f"collective #{finding.seq} raised on rank(s) {finding.raised} as they called it"
                   if finding.raised else
                   f"collective #{finding.seq} is called by every rank and has not completed yet")
        lines.append(f"    {verdict}:")
        for ranks, words in _alike(finding.calls):
            lines.append(f"      {'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)}: {words}")
        for words in finding.splits:
            lines.append(f"      {words}")
        if finding.harmless:
            lines.append("      (the backend moves elements in memory order, as for equal shapes: the result is "
                         "what you meant if the layouts line up)")
        elif finding.completed and finding.mismatch == "the reduce op differs":
            lines.append("      (it completed on every rank anyway; the ranks asked for different reductions, which "
                         "one collective cannot give them both: check the op= each rank passes)")
        elif finding.completed:
            lines.append("      (it completed on every rank anyway: the ranks disagree on what it moves, so at least "
                         "one rank's result is not what its call asked for)")
        for rank, where in sorted(finding.missing.items()):
            lines.append(f"      rank {rank} has not reached it: {where}")
        for rank, how in sorted(finding.unrecorded.items()):
            lines.append(f"      rank {rank}: no record: {how}; whether it called collective #{finding.seq} "
                         "is not known")
        if finding.mismatch and _skipped(finding):
            lines.append("      (a barrier against another collective: one rank skipped a collective the other calls)")
        if finding.after:
            lines.append(f"      (the ranks' calls are out of step since collective #{finding.after}, which differs: "
                         "this follows from it)")
        if finding.torch_says:
            lines.append(f"      torch's matcher: {finding.torch_says}")
    backends = sorted({call.get("backend") or "the backend" for finding in diagnosis.groups
                       for call in finding.calls.values() if renamed(call)})
    if backends:
        lines.append(f"  (#N count the calls {' and '.join(backends)} recorded in that group, not the calls you made: "
                     "one call of yours may be several of the backend's)")
    for rank, wait in sorted(diagnosis.p2p.items()):
        lines.append(f"  rank {rank} waits in {p2p_words(wait)} of {sizes_words(wait.get('sizes', []))} "
                     f"{wait.get('dtype', '')}{line_words(wait.get('at'))}")
    for rank, record in sorted(diagnosis.records.items()):
        started = [] if rank in diagnosis.p2p else record.get("p2p_pending", [])
        for wait in started[:2]:
            lines.append(f"  rank {rank} started {p2p_words(wait)} of {sizes_words(wait.get('sizes', []))} "
                         f"{wait.get('dtype', '')}{line_words(wait.get('at'), 'called ')}, not completed yet; "
                         "it does not wait on it now")
        if len(started) > 2:
            lines.append(f"  rank {rank} started {len(started) - 2} more point-to-point calls, not completed yet")
    for cycle in diagnosis.deadlock:
        lines.append(_cycle_words(cycle, diagnosis.p2p))
    for finding in diagnosis.p2p_findings:
        lines.append(_pair_words(finding))
    for rank, record in sorted(diagnosis.records.items()):
        if record.get("error"):
            lines.append(f"  rank {rank}'s record is incomplete: {record['error']}")
    if diagnosis.unanswered:
        lines.append(f"  rank(s) {diagnosis.unanswered} sent no record (stopped, or gone).")
    if diagnosis.off:
        lines.append(f"  rank(s) {diagnosis.off} record nothing: TORCH_FR_BUFFER_SIZE=0 turned the recorder off.")
    if len(lines) == 1 + bool(diagnosis.source) and (diagnosis.records or not diagnosis.source):  # source: why none
        lines.append("  every collective each rank started has completed on every rank that answered.")
    named = {rank for finding in diagnosis.groups for rank in finding.unrecorded}
    for rank in sorted(set(diagnosis.ended) - set(diagnosis.records) - named):  # gone without its final record
        lines.append(f"  rank {rank}: no record: {diagnosis.ended[rank]}; which collectives it called is not known")
    return "\n".join(lines) + "\n"


def _cycle_words(cycle: list[int], p2p: dict[int, dict]) -> str:
    if len(cycle) == 2:
        a, b = cycle
        wa, wb = p2p[a], p2p[b]
        if pair(wa["op"], wb["op"]):  # a send against a recv: only the tags keep them apart
            return (f"  ranks {a} and {b} each wait on the other, and the tags differ: rank {a}'s "
                    f"{p2p_words(wa, False)} has tag {wa.get('tag', 0)}, rank {b}'s {p2p_words(wb, False)} has tag "
                    f"{wb.get('tag', 0)}. A recv completes only a send with its tag: give both the same tag.")
        return (f"  ranks {a} and {b} each wait on the other: rank {a}'s {wa['op']} needs a matching call on "
                f"rank {b}, which is itself in {wb['op']}. Order them: one rank sends first while the other receives.")
    steps = "; ".join(f"rank {r}'s {p2p[r]['op']} waits on rank {p2p[r]['peer']}, in {p2p_words(p2p[p2p[r]['peer']])}"
                      for r in cycle)
    return (f"  ranks {', '.join(map(str, cycle))} wait in a cycle: {steps}. None can complete: break the cycle "
            "(even ranks send first while odd ranks receive, or isend/irecv every message, then wait on all).")


def _p2p_call_words(rank: int, call: dict) -> str:
    """"rank 1's irecv #1 from rank 0 (tag 0) of [3] float32 (12 bytes), called at ...": #1, its first with
    this peer and tag."""
    return (f"rank {rank}'s {call['op']} #{call['n']} {'to' if 'send' in call['op'] else 'from'} rank {call['peer']} "
            f"(tag {call.get('tag', 0)}) of {sizes_words(call.get('sizes', []))} {call.get('dtype', '')} "
            f"({call.get('nbytes')} bytes){line_words(call.get('at'), 'called ')}")


def _pair_words(finding) -> str:
    """A send/recv that nothing will match, or a send and a recv that gloo pairs whose sizes or dtypes differ."""
    if finding.kind != "unmatched":
        (a, call_a), (b, call_b) = sorted(finding.calls.items())
        what = "sizes" if finding.kind == "size_mismatch" else "dtypes"
        return (f"  the send and the recv that gloo pairs (each rank's #N with that peer and tag) differ in {what}: "
                f"{_p2p_call_words(a, call_a)}; {_p2p_call_words(b, call_b)}. gloo aborts a receiver that is sent "
                "more bytes than its buffer holds: give both sides the same shape and dtype.")
    call, rank, peer = finding.call, finding.rank, finding.peer
    partner = "recv" if "send" in call["op"] else "send"
    state = "failed" if call.get("state") == "failed" else "has not completed"
    words = (f"  {_p2p_call_words(rank, call)} {state}, and rank {peer} ended ({finding.peer_ended}) having posted "
             f"{finding.made} {partner}(s) {'to' if partner == 'send' else 'from'} rank {rank} with tag "
             f"{call.get('tag', 0)}: nothing will match it in this run.")
    if finding.fits:
        other, fit = finding.fits
        named = "src" if partner == "send" else "dst"
        words += (f" Meanwhile {_p2p_call_words(other, fit)} has not completed, and rank {rank} never posted its "
                  f"match: with {named}={other} instead of {named}={peer}, rank {rank}'s call would be paired with "
                  f"it. Check which rank rank {rank} should {'receive from' if partner == 'send' else 'send to'}.")
    else:
        words += (f" Either rank {peer} returned before its {partner} to rank {rank}, or rank {rank} should not "
                  f"{'receive from' if partner == 'send' else 'send to'} it.")
    return words


def _alike(calls: dict[int, dict]) -> list[tuple[list[int], str]]:
    """Ranks whose calls read the same, one line each (at 8 ranks, the one that differs stands out)."""
    by_words: dict[str, list[int]] = {}
    for rank, call in sorted(calls.items()):
        by_words.setdefault(call_words(call), []).append(rank)
    return [(ranks, words) for words, ranks in by_words.items()]  # by each one's first rank, as inserted


def _waits_elsewhere(record: dict | None, group: str) -> bool:
    """The rank has a collective of another group pending (where it waits, if its main thread waits)."""
    return bool(record) and record.get("main") in ("wait", "distributed", "other") and not record.get("in") and any(
        not call["done"] and call["group"] != group for call in record.get("calls", []))


def _skipped(finding) -> bool:
    ops = {call["op"] for call in finding.calls.values()}
    return len(ops) > 1 and "barrier" in ops
