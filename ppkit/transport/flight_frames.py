"""Frames and files as the flight record reads them: a stack's frames, torch's folder, and the learner's own files."""

from __future__ import annotations

import os
import sys


def frames_of(frame) -> list[tuple[str, int, str]]:
    """Innermost first, as the flight recorder lists them."""
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return frames


_OWN = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)  # ppkit/ itself


def torch_dir() -> str:
    torch = sys.modules.get("torch")
    return os.path.dirname(torch.__file__) if torch is not None and torch.__file__ else os.sep + "torch" + os.sep


def is_learners(filename: str) -> bool:
    """A learner's file: not torch, ppkit, the standard library or an installed package; a cell's
    (``<%%torchrun cell 3>``, ``<ipython-input-...>``) is."""
    if filename.startswith("<") and not filename.startswith(("<%%ranks", "<%%torchrun")):
        return filename.startswith("<ipython-input")
    norm = filename.replace("\\", "/")
    return not (any(filename.startswith(own) for own in _OWN) or filename.startswith(torch_dir())
                or "/site-packages/" in norm or "/lib/python3" in norm)


def main_ident(main_frame) -> int | None:
    return next((ident for ident, frame in sys._current_frames().items() if frame is main_frame), None)
