"""What an in-tree build of the wheel carries (`pip install .`, `python -m build --wheel .` in a clone): the
course's files as they are now, not as an earlier build left them, and only the ones git tracks."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile

import pytest
from course_build import build, commit, tracked_copy

pytestmark = pytest.mark.slow


def _course_in(wheel) -> set[str]:
    return {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("ppkit/course/")}


def test_an_in_tree_rebuild_drops_removed_files_and_never_ships_untracked_ones(tmp_path):
    clone = tracked_copy(tmp_path / "clone", git=True)
    (clone / "notebooks" / "99_my_scratch.ipynb").write_text("{}")  # a learner's or author's file git ignores
    (clone / "docs" / "notes-to-self.md").write_text("untracked\n")
    untracked = {"notebooks/99_my_scratch.ipynb", "docs/notes-to-self.md"}
    from_sdist, sdist = build(clone, tmp_path / "dist0")  # as `python -m build`: the sdist, then its wheel
    with tarfile.open(sdist) as tar:
        assert not {name.partition("/")[2] for name in tar.getnames()} & untracked
    [first] = build(clone, tmp_path / "dist1", "--wheel")  # as `pip install .`: the wheel from the clone
    course = _course_in(first)
    assert "ppkit/course/docs/isolation.md" in course and "ppkit/course/notebooks/00_start_here.ipynb" in course
    assert not {f"ppkit/course/{name}" for name in untracked} & course
    assert course == _course_in(from_sdist)

    subprocess.run(["git", "-C", str(clone), "rm", "-q", "docs/isolation.md"], check=True)
    commit(clone, "a doc removed")
    assert (clone / "build" / "lib" / "ppkit" / "course").is_dir()  # the first build's copy is still there
    [second] = build(clone, tmp_path / "dist2", "--wheel")
    assert "ppkit/course/docs/isolation.md" not in _course_in(second)
    assert _course_in(second) == course - {"ppkit/course/docs/isolation.md"}


def test_pip_builds_the_course_into_the_wheel_from_a_git_url_and_from_a_clone_s_folder(tmp_path):
    """What README tells a self-paced learner without the instructor's wheel: `pip install "git+URL"` or
    `pip install /path/to/clone` (not -e); here with a file:// URL, as pip's git+https:// clones the same way."""
    clone = tracked_copy(tmp_path / "clone", git=True)
    for where, source in (("url", f"git+file://{clone}"), ("folder", str(clone))):
        out = tmp_path / where
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--no-index", "-q", "-w", str(out), source], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        [wheel] = out.glob("ppkit-*.whl")
        course = _course_in(wheel)
        assert {"ppkit/course/notebooks/00_start_here.ipynb", "ppkit/course/docs/isolation.md"} <= course, where
