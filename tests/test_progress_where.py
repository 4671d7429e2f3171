"""Where the progress record lies: one folder, ~/ppkit-progress, for every process
of a learner (a kernel, a terminal outside Jupyter, ``ppkit progress --off``); under a Jupyter server rooted inside
the home (``c.Spawner.notebook_dir = "~/notebooks"``, common on workshop hubs) ``<root>/ppkit-progress`` links to
it, so the server's contents API (and so the instructor's room) reads it; a folder of that name that is not a link is
the learner's and is left alone.

A fake Jupyter server is a ``sleep`` child of this test with a ``jpserver-<pid>.json`` in the runtime folder (what
jupyter_server writes at its start); a "kernel" is a process told its server by JPY_PARENT_PID, as jupyter_client
tells a kernel; a "CLI" process has no server above it (ssh, a terminal outside JupyterLab, VS Code).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ppkit.progress import format as fmt
from ppkit.progress import read

WHERE = "from ppkit.progress.format import record_dir; print(record_dir())"
WRITE = "import sys; from ppkit.progress import note; note('check', exercise=sys.argv[1], status='passed')"


def run(home, runtime, code, *args, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in (fmt.DIR_ENV, "JPY_PARENT_PID", "JUPYTER_RUNTIME_DIR", "PPKIT_PROGRESS", fmt.SWITCH_ENV)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          check=True, env={**base, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(runtime), **env})


def where(home, runtime, **env) -> str:
    return run(home, runtime, WHERE, **env).stdout.strip()


def cli(home, runtime, *args) -> str:
    return run(home, runtime, "import sys; from ppkit.cli import main; sys.exit(main(sys.argv[1:]))",
               "progress", *args).stdout


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home" / "notebooks").mkdir(parents=True)
    (tmp_path / "runtime").mkdir()
    return tmp_path / "home"


@pytest.fixture
def server(home):
    """A running fake Jupyter server rooted at ~/notebooks: its pid, as a kernel's JPY_PARENT_PID."""
    proc = subprocess.Popen(["sleep", "600"])
    info = {"pid": proc.pid, "root_dir": str(home / "notebooks"), "url": "http://127.0.0.1:8888/", "port": 8888}
    (home.parent / "runtime" / f"jpserver-{proc.pid}.json").write_text(json.dumps(info))
    yield str(proc.pid)
    proc.kill()
    proc.wait()


def passed(folder) -> list[str]:
    return [e.fields["exercise"] for e in read.read_folder(folder).events if e.kind == "check"]


def test_a_kernel_a_terminal_outside_and_the_off_switch_agree_on_one_record(home, server):
    runtime = home.parent / "runtime"
    kernel = {"JPY_PARENT_PID": server}
    assert where(home, runtime, **kernel) == where(home, runtime) == str(home / "ppkit-progress")
    run(home, runtime, WRITE, "from_the_kernel", **kernel)
    run(home, runtime, WRITE, "from_ssh")  # no Jupyter server above it
    shown = json.loads(cli(home, runtime, "--json"))  # `ppkit progress` from outside sees both
    assert sorted(e["exercise"] for b in shown["notebooks"] for e in b["exercises"]) == ["from_ssh",
                                                                                        "from_the_kernel"]
    # what the server's contents API serves: the link under its root, the same two lines
    link = home / "notebooks" / "ppkit-progress"
    assert link.is_symlink() and link.resolve() == (home / "ppkit-progress").resolve()
    assert passed(link) == ["from_the_kernel", "from_ssh"]
    cli(home, runtime, "--off")  # from outside: stops the kernel's writes too
    run(home, runtime, WRITE, "after_off", **kernel)
    assert passed(home / "ppkit-progress") == ["from_the_kernel", "from_ssh"]


def test_a_stale_server_file_whose_pid_is_now_another_process_names_no_root(home):
    runtime = home.parent / "runtime"
    info = {"pid": os.getpid(), "root_dir": str(home / "notebooks"), "url": "http://127.0.0.1:8888/"}
    stale = runtime / f"jpserver-{os.getpid()}.json"
    stale.write_text(json.dumps(info))
    os.utime(stale, (1.0e9, 1.0e9))  # written in 2001, long before this process (its pid's owner now) started
    run(home, runtime, WRITE, "x")
    assert not (home / "notebooks" / "ppkit-progress").exists()
    os.utime(stale)  # written now: this process is that server
    run(home, runtime, WRITE, "y")
    assert (home / "notebooks" / "ppkit-progress").is_symlink()


def test_a_folder_of_the_links_name_under_the_root_is_the_learners_and_left_as_it_is(home, server):
    runtime = home.parent / "runtime"
    kernel = {"JPY_PARENT_PID": server}
    under_root = home / "notebooks" / "ppkit-progress"
    under_root.mkdir()
    (under_root / "notes.txt").write_text("mine")
    run(home, runtime, WRITE, "now", **kernel)
    assert passed(home / "ppkit-progress") == ["now"]
    assert not under_root.is_symlink() and (under_root / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in under_root.iterdir()) == ["notes.txt"]


def test_an_opt_out_in_the_home_holds_in_a_kernel_under_a_root(home, server):
    runtime = home.parent / "runtime"
    cli(home, runtime, "--off")  # from a terminal outside: ~/ppkit-progress/OFF
    run(home, runtime, WRITE, "x", JPY_PARENT_PID=server)
    assert passed(home / "ppkit-progress") == [] and passed(home / "notebooks" / "ppkit-progress") == []


def test_rooted_in_the_home_outside_it_or_with_no_server_nothing_is_linked(home):
    runtime = home.parent / "runtime"
    assert where(home, runtime) == str(home / "ppkit-progress")
    assert where(home, runtime, PPKIT_RECORD_DIR=str(home / "elsewhere")) == str(home / "elsewhere")
    assert where(home, runtime, PPKIT_RECORD_DIR="~/elsewhere") == str(home / "elsewhere")
    assert not (home / "notebooks" / "ppkit-progress").exists()


def test_a_relative_record_dir_is_refused_with_what_to_set(home):
    runtime = home.parent / "runtime"
    with pytest.raises(subprocess.CalledProcessError) as failed:
        where(home, runtime, PPKIT_RECORD_DIR="notebooks/ppkit-progress")
    assert "ConfigError" in failed.value.stderr and "relative" in failed.value.stderr
    assert "~/notebooks/ppkit-progress" in failed.value.stderr


def test_a_kernel_records_its_notebook_as_its_server_names_it(home, server):
    """jupyter_server gives a kernel JPY_SESSION_NAME as the notebook's path on disk; the record keeps it relative to
    the server's root, as /api/sessions names it, so the room never takes backup/06_pipeline.ipynb for the open
    06_pipeline.ipynb (a match by the end of the path did)."""
    from ppkit.room.progress_fetch import Fetched
    from ppkit.room.progress_rows import row_of

    runtime = home.parent / "runtime"
    on_disk = home / "notebooks" / "backup" / "06_pipeline.ipynb"
    run(home, runtime, WRITE, "pipeline_time", JPY_PARENT_PID=server, JPY_SESSION_NAME=str(on_disk))
    [event] = read.read_folder(home / "ppkit-progress").events
    assert event.notebook == "backup/06_pipeline.ipynb"
    texts = {name: (home / "ppkit-progress" / name).read_text() if (home / "ppkit-progress" / name).exists()
             else None for name in (fmt.OLD, fmt.CURRENT)}
    row = row_of(Fetched("ana", "running", texts=texts, now=event.t + 1,
                         sessions=[{"path": "06_pipeline.ipynb", "kernel": {"execution_state": "idle"}}]))
    assert row.exercises["backup/06_pipeline.ipynb"]["passed"] == ["pipeline_time"]
    assert row.exercises["06_pipeline.ipynb"]["passed"] == []
