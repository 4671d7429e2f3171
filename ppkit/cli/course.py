"""``ppkit course [DIR]``: the notebooks and their docs in a folder of the learner's (ppkit/course/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HELP = "copy the course's notebooks and docs into DIR (default ./ppkit-course); --lab opens JupyterLab there"
DEFAULT_FOLDER = "ppkit-course"
# as the Makefile's LAB_OPTIONS: the server fetches no news and no versions (tests/test_course.py compares them)
LAB_OPTIONS = ["--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


def add_arguments(parser) -> None:
    parser.add_argument("folder", nargs="?", default=DEFAULT_FOLDER, metavar="DIR",
                        help=f"where to put the course (default: ./{DEFAULT_FOLDER}); made if missing")
    parser.add_argument("--update", action="store_true",
                        help="take this ppkit's version of every file you changed, keeping yours beside it "
                             "(NAME.mine.ipynb)")
    parser.add_argument("--lab", action="store_true", help="then start JupyterLab in DIR (on 127.0.0.1 only)")
    parser.epilog = ("A second run updates the files you did not change and lists the ones you did, leaving "
                     "them as they are. The docs that notebooks and ppkit's messages name (docs/...) are in "
                     "DIR/docs.")


def main(args) -> int:
    from ppkit.course import CourseError, copy_course

    try:
        report = copy_course(args.folder, update=args.update)
    except CourseError as exc:
        print(f"ppkit course: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a folder the learner cannot write (read-only, another user's, a full disk)
        where = exc.filename or args.folder
        print(f"ppkit course: error: cannot write the course into {Path(args.folder).expanduser().resolve()} "
              f"({exc.strerror or exc} at {where}). Pick a folder you can write, e.g. in your home: "
              f"ppkit course ~/{DEFAULT_FOLDER}", file=sys.stderr)
        return 1
    print(describe(report, args.lab))
    return start_lab(report.folder) if args.lab else 0


def describe(report, lab: bool) -> str:
    here = _shown(report.folder)
    counts = [f"{len(report.added)} added", f"{len(report.updated)} updated", f"{len(report.unchanged)} unchanged"]
    lines = [f"The course is in {here}: {len(report.notebooks)} notebooks in {here}/notebooks, the docs they name "
             f"in {here}/docs ({', '.join(counts)})."]
    if report.kept:
        lines.append(f"{len(report.kept)} file(s) you had changed now have this ppkit's version; yours are "
                     "kept beside them:")
        lines += [f"  {name}  ->  yours: {kept}" for name, kept in sorted(report.kept.items())]
    if report.differ:
        lines.append(f"{len(report.differ)} file(s) differ from this ppkit's version (your edits, or your saved "
                     "outputs) and were left as they are:")
        lines += [f"  {name}" for name in report.differ]
        lines.append(f"To take the new versions and keep yours beside each: ppkit course --update {here}")
    if not lab:
        lines.append(f"Open it: ppkit course --lab {here}   (or: cd {here} && jupyter lab), then "
                     "notebooks/00_start_here.ipynb.")
    return "\n".join(lines)


def lab_command(folder: Path) -> list[str]:
    """JupyterLab as `make lab` starts it, in ``folder``, opening the first notebook."""
    argv = [sys.executable, "-m", "jupyterlab", f"--notebook-dir={folder}", "--ServerApp.ip=127.0.0.1",
            *LAB_OPTIONS]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers run as root; Jupyter refuses without this
        argv.append("--allow-root")
    return argv + ["notebooks/00_start_here.ipynb"]


def _owns_this_python() -> str | None:
    """None when sys.prefix is the learner's own (a venv they own, or an environment inside their home);
    else why ppkit leaves it alone (a conda base in /opt, a system Python: shared with others)."""
    prefix = Path(sys.prefix).resolve()
    if Path.home().resolve() in prefix.parents:
        return None
    venv = sys.prefix != sys.base_prefix
    owner = prefix.stat().st_uid if prefix.exists() else None
    if venv and (not hasattr(os, "geteuid") or owner == os.geteuid()):
        return None
    return f"{prefix} is {'a venv of another user' if venv else 'not a venv'} and not in your home"


def install_lab_settings() -> str | None:
    """Put the course's JupyterLab overrides where this environment's lab reads them, as `make lab` does,
    when this Python is the learner's own (a venv, an env in their home); returns why not otherwise (a shared
    conda base, a system Python, a folder that cannot be written): the lab then may ask about news once."""
    from ppkit.course import lab_settings

    target = Path(sys.prefix, "share", "jupyter", "lab", "settings", "overrides.d")
    shared = _owns_this_python()
    if shared:
        return f"{shared}, so {target} is left as it is"
    try:
        target.mkdir(parents=True, exist_ok=True)
        for path in lab_settings():
            shutil.copyfile(path, target / path.name)
    except OSError as exc:
        return f"{target} cannot be written ({exc.strerror})"
    return None


def start_lab(folder: Path) -> int:
    missing = install_lab_settings()
    if missing:
        print(f"note: JupyterLab may ask once whether to fetch news: {missing}.", file=sys.stderr)
    print(f"Starting JupyterLab in {_shown(folder)} (Ctrl-C stops it) ...", flush=True)
    return subprocess.call(lab_command(folder), cwd=folder)


def _shown(folder: Path) -> str:
    try:
        return str(folder.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(folder)
