"""Repository-wide pytest hooks: notebooks run by nbval with their exercises solved, and the SLURM test
cluster for notebooks that nbval runs.

nbval collects each notebook as tests/solved_notebooks.py's SolvedNotebook: one run per notebook, with
the registered solutions in its exercise cells, nbval's output checks and a check that every exercise passed.

nbval's cells get no fixtures, and their kernel starts only when a notebook's first cell runs,
inheriting this process's environment. So before the first cell of a notebook that mentions
``launcher="slurm"`` or ``sinfo``, the session's SLURM testbed (tests/slurm_session.py, the same one
the `slurm` fixture of tests/conftest.py gives) is started and its SLURM_CONF put in os.environ,
where that kernel finds it; pytest_sessionfinish stops it.

Without SLURM such a notebook runs anyway (its SLURM section only runs when `sinfo` answers),
except under CI=true, where its first cell fails saying what to install; so it does, anywhere, when
SLURM is installed but the test cluster fails to start.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Tests and nbval's kernels (which inherit this environment; this file is loaded for a notebook-only run
# too) write the learner's progress record (ppkit/progress/) to a scratch folder, never
# ~/ppkit-progress.
os.environ.setdefault("PPKIT_RECORD_DIR", os.path.join(tempfile.gettempdir(), f"ppkit-test-record-{os.getpid()}"))

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))  # the same modules tests/conftest.py imports
pytest.register_assert_rewrite("solved_notebooks", "leftovers")  # their asserts explain themselves as tests' do

import markers  # noqa: E402
import scheduling  # noqa: E402
import slurm_session  # noqa: E402
from nbval.plugin import IPyNbFile  # noqa: E402
from slurm_testbed import SlurmMissing, SlurmTestbedError  # noqa: E402
from solved_notebooks import SolvedNotebook  # noqa: E402
from timing import TimeTable, kind_of  # noqa: E402

_slurm_first_cells: dict[str, Path] = {}  # nodeid of the first cell of a notebook that uses SLURM -> it


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TimeTable(), "ppkit-time-table")  # tests/timing.py: where the time went
    markers.register(config)  # tests/markers.py: -m by kind (cluster, kernel, browser, notebook, ...)


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    """nbval's notebooks run once, with their exercises solved (tests/solved_notebooks.py)."""
    collected = yield
    return [SolvedNotebook.from_parent(parent, path=file_path) if type(node) is IPyNbFile else node
            for node in collected]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s workers (-n 2) get whole files, notebooks and component groups (tests/scheduling.py)."""
    if config.getvalue("dist") in ("load", "loadscope"):
        return scheduling.make_scheduler(config, log)
    return None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    scheduling.check_scopes(items, Path(str(config.rootpath)), kind_of)
    markers.mark(items, kind_of)


def pytest_collection_finish(session: pytest.Session) -> None:
    first_cells: dict[Path, str] = {}
    for item in session.items:
        path = Path(str(item.path))
        if path.suffix == ".ipynb":
            first_cells.setdefault(path, item.nodeid)
    _slurm_first_cells.update({nodeid: path for path, nodeid in first_cells.items()
                               if slurm_session.notebook_uses_slurm(path)})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first cell of a notebook that uses SLURM (its kernel starts with that cell): the session's
    testbed, started here and not at collection, so that a run that collects such a notebook but does not reach
    it (-x, -k, a deselection) starts none."""
    path = _slurm_first_cells.get(item.nodeid)
    if path is None:
        return
    try:
        slurm_session.testbed()
        return
    except SlurmMissing as exc:
        why = slurm_session.missing_message(exc)
        if not slurm_session.in_ci():
            _note(item.session, f"{path.name}: {exc} Its SLURM part runs only where sinfo answers.")
            return
    except SlurmTestbedError as exc:
        why = f"the SLURM test cluster did not start: {exc}"
    pytest.fail(f"{path.name} needs the SLURM test cluster: {why}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    slurm_session.stop()


def _note(session: pytest.Session, text: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, yellow=True)
