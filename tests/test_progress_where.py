"""Where the progress record lies (issue 46, item 10): in a kernel or terminal of a Jupyter server whose root is
inside the learner's home (``c.Spawner.notebook_dir = "~/notebooks"``, common on workshop hubs), under that root,
where the server's contents API, and so the instructor's room, can read it; in the home otherwise.

Each case runs ``record_dir()`` in a child of this process, whose parent (this process) plays the Jupyter server:
its ``jpserver-<pid>.json`` in the runtime folder names the root, as jupyter_server writes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ppkit.progress import format as fmt

WHERE = "from ppkit.progress.format import record_dir; print(record_dir())"


def where(home, runtime, **env) -> str:
    base = {k: v for k, v in os.environ.items() if k not in (fmt.DIR_ENV, "JPY_PARENT_PID", "JUPYTER_RUNTIME_DIR")}
    done = subprocess.run([sys.executable, "-c", WHERE], capture_output=True, text=True, timeout=60, check=True,
                          env={**base, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(runtime), **env})
    return done.stdout.strip()


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home" / "notebooks").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    return tmp_path / "home"


def as_server(runtime, root) -> None:
    """This process is a Jupyter server rooted at `root` (what jupyter_server writes at its start)."""
    info = {"pid": os.getpid(), "root_dir": str(root), "url": "http://127.0.0.1:8888/", "port": 8888}
    (runtime / f"jpserver-{os.getpid()}.json").write_text(json.dumps(info))


def test_under_a_server_rooted_in_notebooks_the_record_lies_under_that_root(home):
    runtime = home.parent / "runtime"
    as_server(runtime, home / "notebooks")
    assert where(home, runtime) == str(home / "notebooks" / "ppkit-progress")
    # a kernel is told its server by JPY_PARENT_PID (jupyter_client sets it); found the same way
    assert where(home, runtime, JPY_PARENT_PID=str(os.getpid())) == str(home / "notebooks" / "ppkit-progress")


def test_rooted_in_the_home_outside_it_or_with_no_server_the_record_lies_in_the_home(home):
    runtime = home.parent / "runtime"
    assert where(home, runtime) == str(home / "ppkit-progress")  # no Jupyter server above this process
    as_server(runtime, home)
    assert where(home, runtime) == str(home / "ppkit-progress")  # TLJH and Z2JH: the root is the home
    as_server(runtime, "/")
    assert where(home, runtime) == str(home / "ppkit-progress")  # a root above the home: the home, as before
    assert where(home, runtime, PPKIT_RECORD_DIR=str(home / "elsewhere")) == str(home / "elsewhere")
