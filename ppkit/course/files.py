"""Which files make the course: what the wheel carries and `ppkit course` copies.

Plain Python with no ppkit import: setup.py loads this file by path at build time, where torch is not
installed, so the wheel and ``ppkit course`` read one list.
"""

from __future__ import annotations

from pathlib import Path

FOLDERS = ("notebooks", "docs")  # as in the repository, so a notebook's links into ../docs work in both
LAB_SETTINGS = "scripts/lab-settings"  # JupyterLab overrides `make lab` installs (no news box)
_SKIPPED = {".ipynb_checkpoints", "__pycache__", ".pytest_cache"}


def course_files(root: Path) -> list[str]:
    """Every file of the course under ``root`` (a clone, or the installed package's course folder), as
    POSIX paths relative to it: all of notebooks/ and docs/, whatever is added there later."""
    found = []
    for folder in FOLDERS:
        for path in sorted((Path(root) / folder).rglob("*")):
            parts = path.relative_to(root).parts
            if path.is_file() and not any(p in _SKIPPED or p.startswith(".") for p in parts):
                found.append("/".join(parts))
    return found


def lab_settings_files(root: Path) -> list[str]:
    """The JupyterLab overrides (scripts/lab-settings/*.json) under ``root``, relative to it."""
    return ["/".join(p.relative_to(root).parts) for p in sorted((Path(root) / LAB_SETTINGS).glob("*.json"))]
