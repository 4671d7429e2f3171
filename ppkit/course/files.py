"""Which files make the course: what the wheel carries and `ppkit course` copies.

Plain Python with no ppkit import: setup.py loads this file by path at build time, where torch is not
installed, so the wheel and ``ppkit course`` read one list.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

FOLDERS = ("notebooks", "docs")  # as in the repository, so a notebook's links into ../docs work in both
LAB_SETTINGS = "scripts/lab-settings"  # JupyterLab overrides `make lab` installs (no news box)
_SKIPPED = {".ipynb_checkpoints", "__pycache__", ".pytest_cache"}


def course_files(root: Path) -> list[str]:
    """Every file of the course under ``root`` (a clone, or the installed package's course folder), as
    POSIX paths relative to it: all of notebooks/ and docs/, whatever is added there later. In a git
    checkout, only the files git tracks (a scratch notebook or a draft doc stays out of the wheel)."""
    root = Path(root)
    tracked = _git_tracked(root, FOLDERS)
    if tracked is not None:
        return [name for name in tracked if (root / name).is_file()]
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*")):
            parts = path.relative_to(root).parts
            if path.is_file() and not any(p in _SKIPPED or p.startswith(".") for p in parts):
                found.append("/".join(parts))
    return found


def _git_tracked(root: Path, folders) -> list[str] | None:
    """The files git tracks under ``folders`` when ``root`` is the top of a git checkout; None elsewhere (an
    installed package, an unpacked sdist) or when git cannot say (no git, a checkout git refuses to read)."""
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *folders], capture_output=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return sorted(name for name in done.stdout.decode().split("\0") if name)


def lab_settings_files(root: Path) -> list[str]:
    """The JupyterLab overrides (scripts/lab-settings/*.json) under ``root``, relative to it."""
    tracked = _git_tracked(Path(root), [LAB_SETTINGS])
    if tracked is not None:
        return [name for name in tracked if name.endswith(".json") and Path(name).parent.as_posix() == LAB_SETTINGS
                and (Path(root) / name).is_file()]
    return ["/".join(p.relative_to(root).parts) for p in sorted((Path(root) / LAB_SETTINGS).glob("*.json"))]
