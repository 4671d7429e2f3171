"""The words for one call, one send or recv, one line of a learner's code (the doctor's report and
its analysis both use them)."""

from __future__ import annotations

import os
import sys


def sizes_words(sizes) -> str:
    return ", ".join(str(list(s)) for s in sizes) or "no tensor"


def call_words(call: dict, with_group: bool = False) -> str:
    """'all_reduce #3 of [4] Float, SUM, called at <cell> line 7: dist.all_reduce(t)' ('its rank waits at'
    where the call's own line is not recorded, only the rank's line as it waits); where the
    learner's call is not the backend's op: 'reduce_scatter (gloo records all_reduce #1-#2) of ...'."""
    dtypes = "/".join(sorted(set(call["input_dtypes"]))) if call["input_sizes"] else ""
    where = f" of group {call['group']}" if with_group else ""
    name = f"{call['op']} #{call['seq']}"
    if renamed(call):
        first, last = call.get("api_seqs") or (call["seq"], call["seq"])
        seqs = f"#{first}" + (f"-#{last}" if last != first else "")
        name = f"{call['api']} ({call.get('backend') or 'the backend'} records {call['op']} {seqs})"
    root = f", root rank {call['root']}" if call.get("root") is not None else ""
    raised = (f"; it raised in this call before {call.get('backend') or 'the backend'} ran it: {call['raised']}"
              if call.get("raised") else "")
    return (f"{name}{where} of {sizes_words(call['input_sizes'])}{' ' + dtypes if dtypes else ''}"
            f"{', ' + call['reduce_op'] if call.get('reduce_op') else ''}{root}"
            f"{line_words(call.get('at'), 'called ') or line_words(call.get('waits_at'), 'its rank waits ')}{raised}")


def renamed(call: dict) -> bool:
    return bool(call.get("api")) and call["api"] != call["op"]


def p2p_words(wait: dict, tagged: bool = True) -> str:
    """'isend to rank 1 (tag 1)', 'recv from rank 0'."""
    tag = f" (tag {wait['tag']})" if wait.get("tag") and tagged else ""
    peer = "any rank" if wait.get("peer") is None else f"rank {wait['peer']}"
    return f"{wait['op']} {'to' if 'send' in wait['op'] else 'from'} {peer}{tag}"


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


def pair(op: str, other: str) -> bool:
    """A send against a recv (either way round)."""
    return ("send" in op) != ("send" in other)
