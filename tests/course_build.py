"""Building ppkit's sdist and wheel the way a maintainer or learner does, in a copy of the clone, so that a build
writes no build/ or ppkit.egg-info into the repository and needs no package index (tests/test_course_build.py,
tests/test_course_wheel.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tracked_copy(dest: Path, git: bool = False) -> Path:
    """The clone's tracked files as they are in the work tree (uncommitted edits included, untracked files
    not), copied into ``dest``; with ``git=True`` the copy is a git checkout of its own with one commit."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in listed.decode().split("\0"):
        if name and (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    if git:
        commit(dest, "the clone's tracked files")
    return dest


def commit(repo: Path, message: str) -> None:
    """Commit what is staged in ``repo`` (made a git checkout of all its files, the first time)."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@localhost"}
    if not (repo / ".git").exists():  # a new checkout takes every file; later, only what was staged
        subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message], check=True, env=env)


def build(source: Path, out: Path, *what: str) -> list[Path]:
    """``python -m build --no-isolation`` of ``source`` (``what``: --wheel, --sdist, or neither for both, the
    wheel then from the sdist); the files it made in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", *what, "--outdir", str(out),
                           str(source)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "No module named build" in done.stderr:
        pytest.skip("the `build` package is missing (it is in the test extra: make setup)")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted(set(out.iterdir()) - before)
