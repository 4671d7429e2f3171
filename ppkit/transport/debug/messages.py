"""The control-channel messages of a pdb session on a rank (rank_pdb.py), held to the same rules
as ../messages.py (small frozen dataclasses of plain fields; tests/test_debugger.py checks them).

    worker      -> controller   DebugPrompt while pdb waits for a command, DebugLeft when it stops
                                asking (continue, quit, or a post-mortem that could not start)
    controller  -> worker       DebugLine (the learner's answer to a DebugPrompt), PostMortem
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DebugPrompt:
    """pdb on this rank printed ``text`` and waits at ``prompt`` for a line; ``where``: the frame it
    stopped in ("file, line N, in fn"), for the notebook's messages."""
    text: str
    prompt: str
    where: str


@dataclass(frozen=True)
class DebugLine:
    """The learner's answer to a ``DebugPrompt``: one pdb command, without its newline."""
    line: str


@dataclass(frozen=True)
class DebugLeft:
    """pdb on this rank stopped asking: the learner continued (``quit`` False) or quit; ``text`` is
    what it printed last; ``problem``: why a post-mortem could not start ("" if it did)."""
    quit: bool
    text: str = ""
    problem: str = ""


@dataclass(frozen=True)
class PostMortem:
    """Open pdb on the traceback of the error this rank's last job raised."""
