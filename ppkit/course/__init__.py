"""The course as a learner gets it: ``ppkit course [DIR]`` copies the notebooks and the docs they name.

An installed ppkit carries them in ppkit/course/ (setup.py puts them there when the wheel is built); a clone
(an editable install) reads its own notebooks/ and docs/. The folder made keeps the repository's layout,
``DIR/notebooks/`` and ``DIR/docs/``, so a notebook's link to ``../docs/debugging.md`` works in both, and the
``docs/...`` that ppkit's messages name is ``DIR/docs/...``.

A second copy never overwrites a file the learner changed: ``DIR/.ppkit-course.json`` keeps a hash of each
file as it was copied; a file that still has it is updated in place, one that does not is left alone and
reported, unless ``update=True``, which keeps the learner's version beside the new one (``NAME.mine.ipynb``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ppkit.course.files import FOLDERS, course_files, lab_settings_files
from ppkit.errors import ConfigError, PPKitError

MANIFEST = ".ppkit-course.json"
_PACKAGED = Path(__file__).resolve().parent
_CLONE = _PACKAGED.parents[1]


class CourseError(PPKitError):
    """The course cannot be copied: this ppkit carries no course files, or the folder's record is unreadable."""


def source() -> Path:
    """The folder the course is read from: the installed package's ppkit/course/, or the clone's root."""
    for root in (_PACKAGED, _CLONE):
        if (root / "notebooks" / "00_start_here.ipynb").is_file():
            return root
    raise CourseError(
        f"this ppkit ({_PACKAGED.parent}) carries no notebooks: neither {_PACKAGED / 'notebooks'} (a wheel built "
        f"by setup.py) nor {_CLONE / 'notebooks'} (a clone) exists. Reinstall ppkit from the course's wheel "
        "(`pip install --force-reinstall ppkit-*.whl`), or from a clone (`pip install /path/to/the/clone`, or "
        "`pip install -e .` in it), not from a copy of the ppkit/ folder alone; not `pip install ppkit`: that "
        "name on PyPI is another project.")


def docs_folder() -> Path:
    """Where this ppkit's docs are: the ``docs/...`` every message and notebook names is in here (and in
    ``DIR/docs`` of the folder ``ppkit course`` made)."""
    return source() / "docs"


def where_docs() -> str:
    """One line for messages that name ``docs/...``: where the learner finds those files (never raises: a
    ppkit without its course files says so in the line)."""
    try:
        here = docs_folder()
    except CourseError as exc:
        return f"docs/... named here: not in this ppkit ({exc})"
    return (f"docs/... named here: {here} (and DIR/docs in the folder `ppkit course` makes, by default "
            "./ppkit-course/docs)")


def lab_settings() -> list[Path]:
    """The JupyterLab overrides the course's labs use (no news box): scripts/lab-settings/*.json."""
    root = source()
    return [root / name for name in lab_settings_files(root)]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def mine_name(path: Path, taken=Path.exists) -> Path:
    """Where ``update`` keeps the learner's version of ``path``: ``NAME.mine.EXT``, numbered if taken."""
    for n in range(1, 1000):
        tag = "mine" if n == 1 else f"mine{n}"
        candidate = path.with_name(f"{path.stem}.{tag}{path.suffix}")
        if not taken(candidate):
            return candidate
    raise FileExistsError(f"{path.parent} already holds 999 kept copies of {path.name}; remove some of them")


@dataclass
class CopyReport:
    """What :func:`copy_course` did, each a list of paths relative to ``folder``."""

    folder: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)  # a new version over a file the learner had not changed
    unchanged: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)  # the learner's edits, left in place
    kept: dict[str, str] = field(default_factory=dict)  # with update=True: file -> where the learner's went

    @property
    def notebooks(self) -> list[str]:
        return sorted(n for n in [*self.added, *self.updated, *self.unchanged, *self.differ, *self.kept]
                      if n.endswith(".ipynb"))


def copy_course(folder: Path | str, update: bool = False) -> CopyReport:
    """Copy the course into ``folder`` (made if missing); see the module's docstring for what a second copy does."""
    folder = Path(folder).expanduser().resolve()
    root = source()
    sources = [root / name for name in FOLDERS]
    if folder in (root, _PACKAGED) or any(folder == path or path in folder.parents for path in sources):
        raise ConfigError(f"{folder} is inside the course's own files ({root}); pick another folder")
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{folder} is a file, not a folder; pick another name for the course folder")
    manifest_path = folder / MANIFEST
    shipped = _read_manifest(manifest_path)
    report = CopyReport(folder)
    for name in course_files(root):
        new, there = root / name, folder / name
        new_digest = _digest(new)
        if not there.exists():
            there.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(new, there)
            report.added.append(name)
        elif _digest(there) == new_digest:
            report.unchanged.append(name)
        elif shipped.get(name) == _digest(there):  # as copied last time: not the learner's work
            shutil.copyfile(new, there)
            report.updated.append(name)
        elif update:
            kept = mine_name(there)
            there.rename(kept)
            shutil.copyfile(new, there)
            report.kept[name] = kept.relative_to(folder).as_posix()
        else:
            report.differ.append(name)
            continue  # its recorded hash stays the one it was copied with
        shipped[name] = new_digest
    manifest_path.write_text(json.dumps({"files": shipped}, indent=1, sort_keys=True) + "\n")
    return report


def _read_manifest(path: Path) -> dict[str, str]:
    try:
        files = json.loads(path.read_text()).get("files", {})
    except FileNotFoundError:
        return {}
    except (ValueError, AttributeError) as exc:
        raise CourseError(f"{path} is not the record `ppkit course` writes ({exc}); move it away and run `ppkit "
                          "course` again: every file that differs is then reported, none overwritten") from exc
    return {str(k): str(v) for k, v in files.items()}
