"""The kit installs the same way everywhere: one dependency list, pinned test versions, clean notebooks."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
CONDA_TO_PYPI = {"pytorch": "torch"}  # conda-forge names that differ from the PyPI ones
NOT_PACKAGES = {"python", "pip"}

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9/3.10
    tomllib = pytest.importorskip("tomli")


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def environment() -> dict:
    return yaml.safe_load((REPO / "environment.yml").read_text())


def conda_requirement(spec: str) -> Requirement:
    name, rest = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", spec.strip()).groups()
    return Requirement(CONDA_TO_PYPI.get(name, name) + rest)


def load_nb_clean():
    spec = importlib.util.spec_from_file_location("nb_clean", REPO / "scripts" / "nb_clean.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- pyproject.toml and environment.yml ------------------------------------------------------------
def test_pyproject_is_valid_pep621():
    data = pyproject()
    project = data["project"]
    assert project["name"] == "ppkit"
    assert project["version"] == importlib.import_module("ppkit").__version__
    assert data["build-system"]["build-backend"] == "setuptools.build_meta"
    for text in project["dependencies"] + [d for extra in project["optional-dependencies"].values()
                                          for d in extra]:
        Requirement(text)  # raises on anything pip would not understand
    Requirement("python" + project["requires-python"].replace("python", ""))
    module, _, attr = project["scripts"]["ppkit"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_environment_yml_and_pyproject_name_the_same_dependencies():
    env = environment()
    conda_specs = [d for d in env["dependencies"] if isinstance(d, str)]
    conda = {r.name: str(r.specifier) for r in map(conda_requirement, conda_specs)
             if r.name not in NOT_PACKAGES}
    pip = {r.name: str(r.specifier) for r in map(Requirement, pyproject()["project"]["dependencies"])}
    assert conda == pip, "environment.yml and pyproject.toml disagree; update both together"
    # the test extra reaches conda users through pip, from pyproject itself
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-e .[test,ft]" in pip_section


def test_the_python_versions_agree():
    env_python = next(d for d in environment()["dependencies"] if isinstance(d, str) and
                      d.startswith("python"))
    assert env_python == "python" + pyproject()["project"]["requires-python"]


def test_constraints_pin_the_tested_torch_and_torchvision():
    pins = {str(Requirement(line)) for line in (REPO / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    assert {"torch==2.14.1", "torchvision==0.29.1"} <= pins
    assert "-c constraints.txt" in (REPO / "Makefile").read_text()


# -- the two commands ------------------------------------------------------------------------------
def make_target(name: str) -> str:
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{name}:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert match, f"the Makefile has no {name!r} target"
    return match.group(1)


def test_readme_names_the_two_commands_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test\b", ci, re.MULTILINE)
    assert (REPO / ".ci" / "run").stat().st_mode & 0o111, ".ci/run must be executable"


def test_make_test_runs_every_test_and_every_notebook():
    recipe = " ".join(make_target("test").replace("\\\n", " ").split())
    assert "pytest -n $(TEST_WORKERS) tests notebooks " in recipe
    assert re.search(r"^TEST_WORKERS \?= 2$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert "pytest -n 2 tests notebooks --nbval-lax" in (REPO / "README.md").read_text()  # what make test runs
    assert "--nbval-lax --nbval-sanitize-with tests/nbval_sanitize.cfg" in recipe
    assert "--durations" not in recipe  # the table of tests/timing.py names the slowest tests, files and kinds


def test_the_time_table_is_registered_for_every_run():
    assert "TimeTable()" in (REPO / "conftest.py").read_text()


def test_make_test_fast_leaves_out_the_slow_tests_and_readme_names_it():
    recipe = make_target("test-fast")
    assert '-m "$(FAST_MARKERS)"' in recipe
    assert "FAST_MARKERS ?= not slow and not slurm and not browser and not hub" in (REPO / "Makefile").read_text()
    assert "make test-fast" in (REPO / "README.md").read_text()
    assert "jupyter lab --notebook-dir=notebooks" in make_target("lab")


# -- notebooks -------------------------------------------------------------------------------------
def test_there_is_a_start_here_notebook():
    assert REPO / "notebooks" / "00_start_here.ipynb" in NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_named_nn_name(path):
    nbformat.validate(nbformat.read(path, as_version=4))
    assert re.fullmatch(r"\d\d[a-z]?_[a-z0-9_]+\.ipynb", path.name)  # 08b: a lesson put between two


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_keeps_only_the_outputs_nbval_checks(path, capsys):
    assert load_nb_clean().main(["--check", str(path)]) == 0, (
        f"{capsys.readouterr().out}\nrun: python scripts/nb_clean.py {path.relative_to(REPO)}")
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code" and cell.outputs:
            assert "NBVAL_CHECK_OUTPUT" in cell.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_what_you_will_learn(path):
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown" and "learn" in first.source.lower()


def test_torchft_is_an_extra_pinned_and_installed_for_the_tests():
    """Notebook 15's fault-tolerance sections run torchft: an extra of its own (a learner on macOS, where it has
    no wheel, installs without it), installed with the test extra by make setup and by conda users, pinned."""
    (torchft,) = map(Requirement, pyproject()["project"]["optional-dependencies"]["ft"])
    assert (torchft.name, str(torchft.specifier)) == ("torchft", ">=0.2")
    # only where 0.2.0 has a wheel, so that `pip install -e .[test,ft]` still works on macOS, Windows, ARM
    assert torchft.marker.evaluate({"sys_platform": "linux", "platform_machine": "x86_64"})
    assert not torchft.marker.evaluate({"sys_platform": "darwin", "platform_machine": "arm64"})
    assert not torchft.marker.evaluate({"sys_platform": "linux", "platform_machine": "aarch64"})
    pins = {str(Requirement(line)) for line in (REPO / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    assert "torchft==0.2.0" in pins
    assert "-e '.[test,ft]'" in make_target(r"\$\(STAMP\)")
    pip_section = next(d["pip"] for d in environment()["dependencies"] if isinstance(d, dict))
    assert "-e .[test,ft]" in pip_section
