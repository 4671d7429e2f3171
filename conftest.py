"""Repository-wide pytest hooks: notebooks run by nbval with their exercises solved, and the SLURM test
cluster for notebooks that nbval runs.

nbval collects each notebook as tests/solved_notebooks.py's SolvedNotebook: one run per notebook, with
the registered solutions in its exercise cells, nbval's output checks and a check that every exercise passed.

nbval's cells get no fixtures, and their kernel starts only when a notebook's first cell runs,
inheriting this process's environment. So once collection is done, if a collected notebook
mentions ``launcher="slurm"`` or ``sinfo``, the session's SLURM testbed (tests/slurm_session.py,
the same one the `slurm` fixture of tests/conftest.py gives) is started and its SLURM_CONF put in
os.environ, where that kernel finds it; pytest_sessionfinish stops it.

Without SLURM such a notebook runs anyway (its SLURM section only runs when `sinfo` answers),
except under CI=true, where its first cell fails saying what to install; so it does, anywhere, when
SLURM is installed but the test cluster fails to start.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))  # the same modules tests/conftest.py imports
pytest.register_assert_rewrite("solved_notebooks", "leftovers")  # their asserts explain themselves as tests' do

import slurm_session  # noqa: E402
from nbval.plugin import IPyNbFile  # noqa: E402
from slurm_testbed import SlurmMissing, SlurmTestbedError  # noqa: E402
from solved_notebooks import SolvedNotebook  # noqa: E402

_failing_cells: dict[str, str] = {}  # nodeid of a notebook's first cell -> why it fails


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    """nbval's notebooks run once, with their exercises solved (tests/solved_notebooks.py)."""
    collected = yield
    return [SolvedNotebook.from_parent(parent, path=file_path) if type(node) is IPyNbFile else node
            for node in collected]


def pytest_collection_finish(session: pytest.Session) -> None:
    first_cells: dict[Path, str] = {}
    for item in session.items:
        path = Path(str(item.path))
        if path.suffix == ".ipynb":
            first_cells.setdefault(path, item.nodeid)
    wanting = {path: nodeid for path, nodeid in first_cells.items() if slurm_session.notebook_uses_slurm(path)}
    if not wanting or session.config.option.collectonly:
        return
    try:
        slurm_session.testbed()
        return
    except SlurmMissing as exc:
        why = slurm_session.missing_message(exc)
        if not slurm_session.in_ci():
            names = ", ".join(p.name for p in wanting)
            _note(session, f"{names}: {exc} Their SLURM part runs only where sinfo answers.")
            return
    except SlurmTestbedError as exc:
        why = f"the SLURM test cluster did not start: {exc}"
    for nodeid in wanting.values():
        _failing_cells[nodeid] = why


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    why = _failing_cells.get(item.nodeid)
    if why is not None:
        pytest.fail(f"{Path(str(item.path)).name} needs the SLURM test cluster: {why}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    slurm_session.stop()


def _note(session: pytest.Session, text: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, yellow=True)
