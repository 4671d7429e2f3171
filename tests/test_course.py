"""`ppkit course [DIR]`: the notebooks and the docs they name, copied into a learner's folder (ppkit/course/).

The installed wheel's side (what it carries, a learner's run of it) is tests/test_course_wheel.py."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import ppkit.course
from ppkit.cli import course as course_cli
from ppkit.cli import main as ppkit_main
from ppkit.course import CourseError, copy_course, course_files, docs_folder, source
from ppkit.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
DOC_NAMED = re.compile(r"\bdocs/([A-Za-z0-9_.-]+\.(?:md|png))")
REPO_PATH_IN_CODE = re.compile(r"""(?:\.\./|\b(?:tests|docs|scripts|benchmarks|notebooks)/|REPO\b|parents\[\d\])""")


@pytest.fixture
def fake_course(tmp_path, monkeypatch):
    """A course source of two notebooks and a doc, standing in for this ppkit's, so a test can ship a
    new version of a file."""
    root = tmp_path / "source"
    (root / "notebooks").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "notebooks" / "00_start_here.ipynb").write_text("v1 of 00\n")
    (root / "notebooks" / "01_next.ipynb").write_text("v1 of 01\n")
    (root / "docs" / "isolation.md").write_text("v1 doc\n")
    monkeypatch.setattr(ppkit.course, "source", lambda: root)
    return root


def run_cli(*argv, capsys) -> tuple[int, str]:
    code = ppkit_main(["course", *argv])
    out = capsys.readouterr()
    return code, out.out + out.err


# -- what the course is ------------------------------------------------------------------------------
def test_the_course_is_every_notebook_and_every_doc_of_the_clone():
    files = course_files(source())
    assert source() == REPO  # an editable install reads the clone itself; no second copy is committed
    assert {f"notebooks/{p.name}" for p in NOTEBOOKS} <= set(files)
    assert {f"docs/{p.name}" for p in (REPO / "docs").iterdir() if p.is_file()} <= set(files)
    assert not [f for f in files if ".ipynb_checkpoints" in f or "__pycache__" in f]


def test_every_doc_that_ppkit_or_a_notebook_names_is_in_the_course():
    named = {}
    for path in sorted((REPO / "ppkit").rglob("*.py")) + NOTEBOOKS:
        for match in DOC_NAMED.finditer(path.read_text(encoding="utf-8")):
            named.setdefault(match.group(1), path.relative_to(REPO).as_posix())
    assert "isolation.md" in named  # preflight's warnings name it (issue 49)
    shipped = set(course_files(source()))
    missing = {f"docs/{name}": where for name, where in named.items() if f"docs/{name}" not in shipped}
    assert not missing, f"named but not in the course a learner gets (name -> first file naming it): {missing}"
    assert docs_folder() == REPO / "docs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_opens_no_path_into_the_repository(path):
    """A pip-installed learner has the course folder, not the clone: no code cell reaches tests/, docs/,
    scripts/ or a parent folder. Prose may name them (the learner has docs/ in the course folder)."""
    nb = nbformat.read(path, as_version=4)
    found = [(n, m.group(0)) for n, cell in enumerate(nb.cells) if cell.cell_type == "code"
             for m in REPO_PATH_IN_CODE.finditer(cell.source)]
    assert not found, f"{path.name}: code cells (index, text) that reach into the repository: {found}"


def test_the_repository_path_check_sees_one():
    assert REPO_PATH_IN_CODE.search('open(Path(ppkit.__file__).parents[1] / "tests" / "x")')
    assert REPO_PATH_IN_CODE.search("pd.read_csv('../docs/table.csv')")
    assert not REPO_PATH_IN_CODE.search("print(dp.port_is_open(12355))")


# -- copying --------------------------------------------------------------------------------------
def test_course_copies_into_ppkit_course_by_default_and_says_how_to_open(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out = run_cli(capsys=capsys)
    assert code == 0
    folder = tmp_path / "ppkit-course"
    for path in NOTEBOOKS:
        assert (folder / "notebooks" / path.name).read_bytes() == path.read_bytes()
    assert (folder / "docs" / "isolation.md").read_bytes() == (REPO / "docs" / "isolation.md").read_bytes()
    assert f"{len(NOTEBOOKS)} notebooks in ppkit-course/notebooks" in out
    assert "ppkit course --lab ppkit-course" in out and "notebooks/00_start_here.ipynb" in out
    assert "docs they name in ppkit-course/docs" in out


def test_a_second_run_leaves_an_edited_notebook_and_names_it(tmp_path, capsys):
    folder = tmp_path / "mine"
    assert run_cli(str(folder), capsys=capsys)[0] == 0
    edited = folder / "notebooks" / NOTEBOOKS[0].name
    edited.write_text(edited.read_text() + "\n")  # a saved notebook: outputs, edits
    code, out = run_cli(str(folder), capsys=capsys)
    assert code == 0
    assert edited.read_text() == NOTEBOOKS[0].read_text() + "\n"
    assert "1 file(s) differ from this ppkit's version" in out and f"  notebooks/{NOTEBOOKS[0].name}" in out
    assert f"ppkit course --update {folder}" in out


def test_a_new_version_replaces_a_file_the_learner_did_not_change(fake_course, tmp_path):
    folder = tmp_path / "course"
    assert sorted(copy_course(folder).added) == ["docs/isolation.md", "notebooks/00_start_here.ipynb",
                                                 "notebooks/01_next.ipynb"]
    (fake_course / "notebooks" / "01_next.ipynb").write_text("v2 of 01\n")
    (fake_course / "notebooks" / "02_new.ipynb").write_text("v2 adds 02\n")
    report = copy_course(folder)
    assert report.updated == ["notebooks/01_next.ipynb"] and report.added == ["notebooks/02_new.ipynb"]
    assert (folder / "notebooks" / "01_next.ipynb").read_text() == "v2 of 01\n"
    assert report.differ == []


def test_without_update_an_edited_file_stays_even_when_a_new_version_comes(fake_course, tmp_path):
    folder = tmp_path / "course"
    copy_course(folder)
    (folder / "notebooks" / "01_next.ipynb").write_text("the learner's 01\n")
    (fake_course / "notebooks" / "01_next.ipynb").write_text("v2 of 01\n")
    assert copy_course(folder).differ == ["notebooks/01_next.ipynb"]
    assert copy_course(folder).differ == ["notebooks/01_next.ipynb"]  # and again: still theirs, not "shipped"
    assert (folder / "notebooks" / "01_next.ipynb").read_text() == "the learner's 01\n"


def test_update_takes_the_new_version_and_keeps_the_learners_beside_it(fake_course, tmp_path, capsys):
    folder = tmp_path / "course"
    copy_course(folder)
    nb = folder / "notebooks" / "01_next.ipynb"
    nb.write_text("the learner's 01\n")
    (fake_course / "notebooks" / "01_next.ipynb").write_text("v2 of 01\n")
    code, out = run_cli("--update", str(folder), capsys=capsys)
    assert code == 0
    assert nb.read_text() == "v2 of 01\n"
    assert (folder / "notebooks" / "01_next.mine.ipynb").read_text() == "the learner's 01\n"
    assert "notebooks/01_next.ipynb  ->  yours: notebooks/01_next.mine.ipynb" in out
    nb.write_text("the learner's second try\n")  # a second update keeps both of theirs
    assert copy_course(folder, update=True).kept == {"notebooks/01_next.ipynb": "notebooks/01_next.mine2.ipynb"}
    assert (folder / "notebooks" / "01_next.mine.ipynb").read_text() == "the learner's 01\n"
    assert copy_course(folder).differ == [] and copy_course(folder).kept == {}


def test_an_unreadable_record_stops_the_copy_and_says_what_to_do(fake_course, tmp_path, capsys):
    folder = tmp_path / "course"
    copy_course(folder)
    (folder / ppkit.course.MANIFEST).write_text("{not json")
    (folder / "notebooks" / "01_next.ipynb").write_text("the learner's 01\n")
    code, out = run_cli(str(folder), capsys=capsys)
    assert code == 1 and "move it away and run `ppkit course` again" in out
    assert (folder / "notebooks" / "01_next.ipynb").read_text() == "the learner's 01\n"


def test_a_folder_inside_the_course_sources_or_a_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="inside the course's own files"):
        copy_course(REPO / "notebooks" / "copy")
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        copy_course(tmp_path / "afile")


def test_a_ppkit_without_course_files_says_how_to_get_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ppkit.course, "_PACKAGED", tmp_path / "site-packages" / "ppkit" / "course")
    monkeypatch.setattr(ppkit.course, "_CLONE", tmp_path / "site-packages")
    with pytest.raises(CourseError, match="carries no notebooks"):
        source()
    code, out = run_cli(str(tmp_path / "course"), capsys=capsys)
    assert code == 1 and "pip install --force-reinstall ppkit-*.whl" in out
    assert not (tmp_path / "course").exists()


# -- --lab ----------------------------------------------------------------------------------------
def test_lab_uses_the_makefile_lab_options_and_allow_root_only_as_root(monkeypatch, tmp_path):
    makefile = (REPO / "Makefile").read_text()
    options = re.search(r"^LAB_OPTIONS := (.*)$", makefile, re.MULTILINE).group(1).split()
    assert course_cli.LAB_OPTIONS == options
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    argv = course_cli.lab_command(tmp_path)
    assert "--allow-root" not in argv and f"--notebook-dir={tmp_path}" in argv
    assert "--ServerApp.ip=127.0.0.1" in argv and argv[-1] == "notebooks/00_start_here.ipynb"
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert "--allow-root" in course_cli.lab_command(tmp_path)
    settings = [p.name for p in ppkit.course.lab_settings()]
    assert settings == sorted(p.name for p in (REPO / "scripts" / "lab-settings").glob("*.json")) and settings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_lab_starts_jupyterlab_in_the_course_folder(tmp_path):
    port, token = _free_port(), "course-test-token"
    env = {**os.environ, "JUPYTER_PORT": str(port), "JUPYTER_TOKEN": token, "BROWSER": "true",
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"open_browser": False}}))
    folder = tmp_path / "course"
    proc = subprocess.Popen([sys.executable, "-m", "ppkit", "course", "--lab", str(folder)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        listing = None
        deadline = time.monotonic() + 120
        while listing is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                url = f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    listing = json.load(answer)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, f"no JupyterLab on port {port} (exit {proc.poll()})"
        assert {f"{p.name}" for p in NOTEBOOKS} <= {item["name"] for item in listing["content"]}
    finally:
        os.killpg(proc.pid, 15)
        out = proc.communicate(timeout=60)[0]
    assert f"Starting JupyterLab in {folder}" in out
    overrides = Path(sys.prefix, "share", "jupyter", "lab", "settings", "overrides.d", "ppkit-workshop.json")
    assert overrides.read_text() == (REPO / "scripts" / "lab-settings" / "ppkit-workshop.json").read_text()


# -- where docs/ is, for messages that name it ------------------------------------------------------------------
def _preflight_naming_docs(lines: list):
    """A preflight whose slow checks are stand-ins and whose ports check warns, naming docs/isolation.md."""
    from ppkit import preflight

    checker = preflight.Preflight(emit=lines.append)
    stand_ins = {"memory": "ok", "cluster": "ok", "rpc_world": "ok", "pipeline": "ok", "ports": "warn"}
    for name, status in stand_ins.items():
        def check(name=name, status=status):
            detail = "reachable by other users (docs/isolation.md)" if status == "warn" else "stand-in"
            return preflight.Check(name.replace("_", " "), status, detail)
        check.__name__ = name
        setattr(checker, name, check)
    return checker


def test_preflight_says_where_the_docs_it_names_are_just_before_its_summary():
    from ppkit import preflight

    lines = []
    checker = _preflight_naming_docs(lines)
    checker.run()
    assert lines[-2] == ppkit.course.where_docs() and lines[-1] == checker.summary()
    assert lines[-2].startswith(f"docs/... named here: {REPO / 'docs'}") and "./ppkit-course/docs" in lines[-2]

    def ports():
        return preflight.Check("ports", "ok", "free")

    lines.clear()
    checker.ports = ports
    checker.checks.clear()
    checker.run()
    assert lines[-1] == checker.summary() and ppkit.course.where_docs() not in lines  # nothing named docs/


def test_preflight_without_course_files_still_ends_with_its_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(ppkit.course, "_PACKAGED", tmp_path / "site-packages" / "ppkit" / "course")
    monkeypatch.setattr(ppkit.course, "_CLONE", tmp_path / "site-packages")
    lines = []
    checker = _preflight_naming_docs(lines)
    checker.run()
    assert lines[-1] == checker.summary()
    assert "docs/... named here: not in this ppkit" in lines[-2] and "carries no notebooks" in lines[-2]


# -- the notebook-only start (tests/test_course_wheel.py runs the cell where ppkit is missing) --------------------
def test_notebook_00_first_installs_this_versions_wheel_and_only_where_ppkit_is_missing():
    version = ppkit.__version__
    first = next(c for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells if c.cell_type == "code")
    assert NOTEBOOKS[0].name == "00_start_here.ipynb"
    assert f'"ppkit-{version}-py3-none-any.whl"' in first.source  # the name `python -m build` gives this version
    assert 'if importlib.util.find_spec("ppkit") is None:' in first.source
    assert "    %pip install {PPKIT_SOURCE}" in first.source and "Restart the kernel once" in first.source


# -- what messages tell a learner to install --------------------------------------------------------
PIP_INSTALL_PPKIT = re.compile(r"(?P<before>.{0,5})pip install(?:\s+--?[\w-]+)*\s+['\"]?ppkit\b(?![-.\w])")


def test_no_message_says_pip_install_ppkit_the_name_of_another_project_on_pypi():
    """`pip install ppkit` (or --upgrade ppkit) installs another project from PyPI; the course's wheel is a file
    (ppkit-0.1.0-...whl) or a clone. Only a warning against it ("Not `pip install ppkit`") may name it."""
    found = []
    for path in [*sorted((REPO / "ppkit").rglob("*.py")), *NOTEBOOKS, *sorted((REPO / "docs").glob("*.md"))]:
        for number, text in enumerate(path.read_text().splitlines(), 1):
            for match in PIP_INSTALL_PPKIT.finditer(text):
                if not match.group("before").lower().endswith("not `"):
                    found.append(f"{path.relative_to(REPO)}:{number}: {match.group(0).strip()}")
    assert not found, "messages that would install PyPI's other ppkit:\n" + "\n".join(found)


def test_a_folder_that_cannot_be_written_is_named_with_what_to_do(fake_course, tmp_path, monkeypatch, capsys):
    def refused(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))

    monkeypatch.setattr(ppkit.course.shutil, "copyfile", refused)  # root writes anywhere: refuse as a learner is
    code, out = run_cli(str(tmp_path / "course"), capsys=capsys)
    assert code == 1 and f"cannot write the course into {tmp_path / 'course'}" in out
    assert "Permission denied" in out and "Traceback" not in out and "ppkit course ~/ppkit-course" in out


def test_lab_settings_go_only_into_a_python_of_the_learner_s_own(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    target = Path("share", "jupyter", "lab", "settings", "overrides.d", "ppkit-workshop.json")
    for prefix, base, written in ((tmp_path / "opt" / "conda", tmp_path / "opt" / "conda", False),  # shared base
                                  (home / "miniconda", home / "miniconda", True),  # an env in their home
                                  (tmp_path / "venv", tmp_path / "opt" / "conda", True)):  # a venv they own
        prefix.mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(sys, "prefix", str(prefix))
        monkeypatch.setattr(sys, "base_prefix", str(base))
        why = course_cli.install_lab_settings()
        assert (prefix / target).is_file() == written, (prefix, why)
        assert (why is None) == written and (written or f"{prefix} is not a venv and not in your home" in why)


def test_preflight_s_install_fixes_start_with_a_command_a_pip_learner_can_run(monkeypatch):
    """A learner with the wheel has no clone, no constraints.txt and no make: the fix leads with pinned pip."""
    import torch

    from ppkit import preflight

    pins = "pip install 'torch==2.14.1' 'torchvision==0.29.1'"
    pinned = (REPO / "constraints.txt").read_text().split()
    assert [pin for pin in pinned if pin.startswith(("torch==", "torchvision=="))] == ["torch==2.14.1",
                                                                                      "torchvision==0.29.1"]
    monkeypatch.setattr(torch, "__version__", "2.9.0")
    check = preflight.Preflight().torch()
    assert check.status == "warn" and check.fix.startswith(pins) and "from a clone" in check.fix
    python = preflight.Preflight()
    monkeypatch.setattr(preflight.platform, "python_version", lambda: "3.9.18")
    fix = python.python().fix
    assert "-m venv" in fix and "ppkit-*.whl" in fix and fix.index("ppkit-*.whl") < fix.index("make lab")
