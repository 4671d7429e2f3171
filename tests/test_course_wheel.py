"""The wheel a learner pip-installs carries the course, and an ordinary Unix user runs it with no clone,
no make and no root (issue 49).

One wheel per module, built as `python -m build` builds it: an sdist first, the wheel from that sdist (so
MANIFEST.in is checked too), from a copy of the clone's tracked files and with --no-isolation (tests/course_build.py:
nothing written into the clone, no package index needed). The learner's TMPDIR is in its home, and what it still
leaves in /tmp, /var/tmp or /dev/shm is removed before the user is. The learner's test then, as a fresh user made
with useradd:

- makes a venv with the system's Python (pyenv's, under a 0700 /root, is not theirs to run) and installs the
  wheel into it as notebook 00's first code cell does (its ``%pip``, run by IPython in that venv), offline,
  against constraints.txt; run again, the cell installs nothing;
- runs `ppkit course`, `ppkit preflight`, and nbval on notebooks 00, 03 and 09 from the course folder (09: the
  lightest of 09-13, 69 s under nbval at load 8.7 against 114 s for 12; 13 starts 8 ranks);
- sees no repository: it runs in a mount namespace where the clone is an empty folder (only the test venv
  inside, see below), so a notebook that opened tests/, docs/ or scripts/ of the repository would fail.

What it borrows, to keep to minutes: the learner's venv reads this test venv's site-packages (a .pth line, through
a bind mount in /tmp, so that a clone in a private folder works too) for torch, JupyterLab and nbval, and its
share/jupyter (JUPYTER_PATH) for the widgets' JupyterLab extension, instead of downloading 1 GB. pip still resolves
the wheel's dependencies (with --no-index, against constraints.txt) and installs ppkit itself into the learner's
venv; a .pth line is not a site dir, so this venv's editable ppkit (an import hook in a .pth) is not loaded, and
the test asserts that `ppkit` is the wheel's. Not checked here: that PyPI's torch wheels install in an empty venv.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

import psutil
import pytest
import unix_users
from course_build import build, tracked_copy

from ppkit.course import course_files

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
# prints notebook 00's first code cell, read from the wheel (argv[1]); also keeps the notebook to compare
FIRST_CELL = """import json, sys, zipfile
text = zipfile.ZipFile(sys.argv[1]).read("ppkit/course/notebooks/00_start_here.ipynb")
open("install.ipy.source", "wb").write(text)
print(next("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "code"))"""
LEARNER_NOTEBOOKS = ("00_start_here.ipynb", "03_data_parallel.ipynb", "09_sharded_data_parallel.ipynb")
ALLOWED = ("/tmp", "/var/tmp", "/dev/shm")  # and the user's home (under /tmp here) and /run/user/UID

pytestmark = pytest.mark.slow


def _cannot(reason: str):
    """Skip, except under CI=true, where a check that cannot run is a failure (the brief of issue 49)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"cannot run under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the clone's tracked files (no build/ or ppkit.egg-info left in the clone), with
    this venv's setuptools (--no-isolation: no package index needed)."""
    if importlib.util.find_spec("build") is None:
        _cannot("the `build` package is missing (it is in the test extra: make setup)")
    out = tmp_path_factory.mktemp("dist")
    made = build(tracked_copy(tmp_path_factory.mktemp("clone")), out)
    wheels = sorted(out.glob("ppkit-*.whl"))
    assert len(wheels) == 1 and sorted(out.glob("ppkit-*.tar.gz")), made
    return wheels[0]


def test_the_wheel_carries_every_notebook_doc_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    course = course_files(REPO)
    assert [n for n in course if n.startswith("notebooks/")] == \
        [f"notebooks/{p.name}" for p in sorted((REPO / "notebooks").glob("*.ipynb"))]  # every one, by glob
    missing = [n for n in course if f"ppkit/course/{n}" not in names]
    assert not missing, f"course files the wheel lacks: {missing}"
    assert "ppkit/course/scripts/lab-settings/ppkit-workshop.json" in names
    data = [p.relative_to(REPO).as_posix() for p in (REPO / "ppkit").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert not [d for d in data if d not in names], f"package data the wheel lacks: {set(data) - names}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "docs/", "notebooks/"))]


def _learner_script(user, stash: str, steps: str) -> str:
    """Root's part in a private mount namespace (the clone hidden, the test venv seen at ``stash``), then the
    user's. The learner reads the test venv at ``stash`` (a 0755 folder in /tmp), never at its own path: a clone
    under a private folder (``mktemp -d``, mode 0700) is not the learner's to enter."""
    lines = ["set -e", f"mount --bind {shlex.quote(sys.prefix)} {shlex.quote(stash)}",
             f"mount -t tmpfs -o mode=0755 ppkit-no-clone {shlex.quote(str(REPO))}"]
    switch = shlex.join(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--",
                         "sh", "-c", steps])
    return "\n".join(lines + [f"cd {shlex.quote(user.home)}", f"exec {switch}"])


def _still_running(user, timeout: float = 15.0) -> list:
    """The user's processes still running after ``timeout`` (zombies count as gone: here nothing reaps
    orphans, PID 1 is not an init)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for proc in unix_users.processes_of(user):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _remove_temp_files_of(user) -> list[str]:
    """Delete what the user left in the shared temp folders (outside its home), before userdel leaves it owned
    by a uid nobody has; returns what was there."""
    prune = f"-path {shlex.quote(user.home)} -prune -o"
    found = subprocess.run(f"find {' '.join(ALLOWED)} {prune} -uid {user.uid} -print", shell=True,
                           capture_output=True, text=True, timeout=300).stdout.split("\n")
    left = [name for name in found if name]
    for name in sorted(left, key=len, reverse=True):  # a folder's files before the folder
        path = Path(name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return left


def _files_written_outside(user) -> list[str]:
    allowed = [*ALLOWED, user.home, f"/run/user/{user.uid}", "/proc", "/sys"]
    prune = " -o ".join(f"-path {shlex.quote(p)}" for p in allowed)
    found = subprocess.run(f"find / \\( {prune} \\) -prune -o -uid {user.uid} -print", shell=True,
                           capture_output=True, text=True, timeout=600)
    return [line for line in found.stdout.splitlines() if line]


@pytest.mark.timeout(1800)  # three notebooks' runs: about 3 min on a quiet 2-core machine, twice that when busy
def test_an_ordinary_user_installs_the_wheel_and_runs_the_course(wheel, tmp_path, request):
    reason = unix_users.unavailable_reason()
    if reason:
        _cannot(reason)
    if not SYSTEM_PYTHON.exists():
        _cannot(f"{SYSTEM_PYTHON} (the system's Python, the same minor version as this one) is missing")
    stash = tempfile.mkdtemp(prefix="ppkit-stash-", dir="/tmp")  # the test venv's mount point, in the namespace only
    os.chmod(stash, 0o755)
    request.addfinalizer(lambda: os.rmdir(stash))
    borrowed = Path(stash, Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix))
    with unix_users.unix_user("lrn") as user:
        request.addfinalizer(lambda: _remove_temp_files_of(user))  # also when an assert below fails (uid kept)
        home = Path(user.home)
        for name in (wheel, REPO / "constraints.txt", REPO / "tests" / "nbval_sanitize.cfg"):
            shutil.copy(name, home / Path(name).name)  # the learner has a download, not the clone
        subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(home)], check=True)
        venv = home / "venv"
        notebooks = " ".join(f"notebooks/{n}" for n in LEARNER_NOTEBOOKS)
        steps = "\n".join([
            "set -ex",
            f"{SYSTEM_PYTHON} -m venv --without-pip {venv}",
            f"echo {shlex.quote(str(borrowed))} > {venv}/lib/python3.{sys.version_info.minor}/site-packages/"
            "zz-borrowed-from-the-test-venv.pth",
            # the notebook-only start: notebook 00's first code cell, run in a Python without ppkit
            f"{venv}/bin/python -c {shlex.quote(FIRST_CELL)} {wheel.name} > install.ipy",
            # its default PPKIT_SOURCE is the wheel's name, beside the notebook (here: the current folder)
            f"{venv}/bin/python -m IPython --quick install.ipy | tee installed.txt",
            "grep -q 'Restart the kernel once' installed.txt",
            f"{venv}/bin/python -m IPython --quick install.ipy | grep -q 'nothing to install'",  # after the restart
            f'test "$({venv}/bin/python -c "import ppkit; print(ppkit.__file__)")" = '
            f"{venv}/lib/python3.{sys.version_info.minor}/site-packages/ppkit/__init__.py",
            f"test ! -e {REPO / 'tests'}",  # the clone is hidden
            f"{venv}/bin/ppkit course",
            "cmp ppkit-course/notebooks/00_start_here.ipynb install.ipy.source",
            f"{venv}/bin/ppkit course | grep -q '0 added, 0 updated'",  # a second run copies nothing
            f"{venv}/bin/ppkit preflight",
            "cd ppkit-course",
            f"{venv}/bin/python -m pytest -p no:cacheprovider -q --nbval-lax --nbval-cell-timeout=300 "
            f"--nbval-sanitize-with ../nbval_sanitize.cfg {notebooks}",
            "echo LEARNER-DONE",
        ])
        (home / "tmp").mkdir(mode=0o700)
        os.chown(home / "tmp", user.uid, user.gid)
        env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": user.home, "USER": user.name, "LOGNAME": user.name,
               "LANG": "C.UTF-8", "PIP_NO_INPUT": "1",
               # the learner's temp files (sockets, torch's compile caches) go with the home, not into /tmp
               "TMPDIR": str(home / "tmp"),
               # the %pip of notebook 00, as `pip install -c constraints.txt` offline (see the module's docstring)
               "PIP_NO_INDEX": "1", "PIP_CONSTRAINT": str(Path(user.home, "constraints.txt")),
               "JUPYTER_PATH": str(Path(stash, "share", "jupyter"))}
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               _learner_script(user, stash, steps)],
                              env=env, capture_output=True, text=True, timeout=1500)
        shown = f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
        assert done.returncode == 0 and "LEARNER-DONE" in done.stdout, shown
        assert re.search(r"^ppkit preflight: (\d+)/\1 ok", done.stdout, re.MULTILINE), shown
        summary = re.search(r"^=* ?(\d+) passed[^\n]*$", done.stdout, re.MULTILINE)
        assert summary and "failed" not in summary.group(0) and "error" not in summary.group(0), shown
        assert (home / "ppkit-course" / "docs" / "isolation.md").is_file()
        assert not _still_running(user), "the learner's run left processes behind"
        outside = _files_written_outside(user)
        left_in_tmp = _remove_temp_files_of(user)
        print(f"left in the shared temp folders despite TMPDIR (now removed): {left_in_tmp}")
        assert not outside, f"the learner's run wrote outside its home and the temp folders: {outside[:20]}"
