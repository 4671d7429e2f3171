"""A rank's process ends as a plain script's does when threads outlive its main function: a thread
pool that an imported library keeps (as many do), a non-daemon thread that ends by itself and an
atexit handler, in the interpreter's order: ``threading._shutdown()`` (the callbacks of
``threading._register_atexit``, which stop the pool's workers, then the non-daemon threads joined),
then the atexit handlers. Through ``ppkit.spawn`` with both start methods and through ``%%torchrun``,
each compared with the same code run as ``python script.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_spawn import assert_none_left
from test_torchrun import shell  # noqa: F401 - the fixture: one IPython shell with %load_ext ppkit

import ppkit

pytestmark = pytest.mark.timeout(300)

LIBRARY = '''\
"""A library that keeps a thread pool for the life of the process."""
import concurrent.futures

POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2)
'''

SCENARIO = '''\
"""Work left to threads when main returns; each step notes itself in FOLDER/order-NAME, in order."""
import atexit
import os
import threading
import time

import heldpool


def main(folder, name):
    def note(what):
        with open(os.path.join(folder, f"order-{name}"), "a") as file:
            file.write(what + "\\n")

    returned, pooled = threading.Event(), threading.Event()

    def pool_task():
        returned.wait()
        note("pool task")
        pooled.set()

    def ends_by_itself():
        pooled.wait()
        time.sleep(0.3)  # still running when the interpreter starts to exit
        note("non-daemon thread ends by itself")

    def at_exit():
        try:
            heldpool.POOL.submit(print)
            note("atexit handler: the pool still takes work")
        except RuntimeError as exc:  # the interpreter stopped the pool's workers before the atexit handlers
            note(f"atexit handler: {exc}")

    heldpool.POOL.submit(pool_task)
    threading.Thread(target=ends_by_itself).start()  # not a daemon
    atexit.register(at_exit)
    note("main returns")
    returned.set()
'''

SCRIPT = "import sys, scenario\nscenario.main(sys.argv[1], 'script')\n"
AS_A_SCRIPT = ["main returns", "pool task", "non-daemon thread ends by itself",
               "atexit handler: cannot schedule new futures after shutdown"]  # its workers, stopping, marked it so


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "heldpool.py").write_text(LIBRARY)
    (tmp_path / "scenario.py").write_text(SCENARIO)
    return tmp_path


def order(folder, name: str) -> list[str]:
    return (folder / f"order-{name}").read_text().splitlines()


def as_a_script(folder) -> list[str]:
    (folder / "script.py").write_text(SCRIPT)
    subprocess.run([sys.executable, str(folder / "script.py"), str(folder)], cwd=folder, check=True, timeout=60)
    seen = order(folder, "script")
    assert seen == AS_A_SCRIPT  # the interpreter's own exit, the pool shut down before the atexit handlers
    return seen


def _rank_main(i, folder):
    sys.path.insert(0, str(folder))
    import scenario

    scenario.main(str(folder), f"rank-{i}")


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_spawn_ends_with_a_held_pool_as_a_script_does(folder, method):
    ppkit.spawn(_rank_main, args=(folder,), nprocs=2, start_method=method, timeout=90)
    script = as_a_script(folder)
    assert order(folder, "rank-0") == order(folder, "rank-1") == script
    assert_none_left()


def test_torchrun_ends_with_a_held_pool_as_a_script_does(shell, folder, monkeypatch):  # noqa: F811 - the fixture
    monkeypatch.chdir(folder)  # the notebook's folder: the script's, where scenario.py is found
    result = shell.run_cell("%%torchrun --nproc-per-node 2 --timeout 90\n"
                            "import os, scenario\nscenario.main(os.getcwd(), 'rank-' + os.environ['RANK'])\n",
                            store_history=False)
    assert result.success, result.error_in_exec
    script = as_a_script(folder)
    assert order(folder, "rank-0") == order(folder, "rank-1") == script


INHERITED = '''\
"""Exit handlers that the standard library registered at its import, before the job ran: in a rank, the
fork server imported logging and multiprocessing (torch does), so their atexit handlers are the fork server's."""
import logging
import logging.handlers
import multiprocessing
import os
import time


def _child(folder, name):
    time.sleep(1.0)
    open(os.path.join(folder, f"child-done-{name}"), "w").close()


def main(folder, name):
    log = logging.getLogger(f"lib-{name}")
    log.setLevel(logging.INFO)
    target = logging.FileHandler(os.path.join(folder, f"log-{name}"))
    log.addHandler(logging.handlers.MemoryHandler(100, target=target))  # flushed by logging.shutdown at exit
    log.info("a record buffered until logging.shutdown")
    child = multiprocessing.get_context("fork").Process(target=_child, args=(folder, name))  # not a daemon
    child.start()  # multiprocessing's own atexit handler joins it
'''


def _inherited_main(i, folder):
    sys.path.insert(0, str(folder))
    import inherited

    inherited.main(str(folder), f"rank-{i}")


def _left(folder, name: str) -> tuple[str, bool]:
    log = folder / f"log-{name}"
    return (log.read_text() if log.exists() else "", (folder / f"child-done-{name}").exists())


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_spawn_runs_the_atexit_handlers_libraries_registered_before_the_job(tmp_path, method):
    (tmp_path / "inherited.py").write_text(INHERITED)
    (tmp_path / "script.py").write_text("import sys, inherited\ninherited.main(sys.argv[1], 'script')\n")
    subprocess.run([sys.executable, str(tmp_path / "script.py"), str(tmp_path)], cwd=tmp_path, check=True,
                   timeout=60)
    script = _left(tmp_path, "script")
    assert script == ("a record buffered until logging.shutdown\n", True)  # the interpreter's exit
    ppkit.spawn(_inherited_main, args=(tmp_path,), nprocs=2, start_method=method, timeout=90)
    assert _left(tmp_path, "rank-0") == _left(tmp_path, "rank-1") == script
    assert_none_left()


def _failing_exit_callback(i, folder):
    import atexit
    import threading

    threading._register_atexit(lambda: 1 / 0)
    atexit.register(lambda: (folder / f"atexit-rank-{i}").write_text("ran"))


def test_an_error_in_an_exit_callback_is_printed_and_ignored_as_a_script_does(tmp_path, capfd):
    script = tmp_path / "script.py"
    script.write_text("import atexit, pathlib, sys, threading\nthreading._register_atexit(lambda: 1 / 0)\n"
                      "atexit.register(lambda: pathlib.Path(sys.argv[1], 'atexit-script').write_text('ran'))\n")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Exception ignored in: <module 'threading'" in done.stderr
    assert "ZeroDivisionError" in done.stderr and (tmp_path / "atexit-script").exists()
    capfd.readouterr()
    ppkit.spawn(_failing_exit_callback, args=(tmp_path,), nprocs=2, timeout=90)  # a success, as the script's
    printed = capfd.readouterr()
    text = printed.out + printed.err
    for rank in (0, 1):
        assert f"[rank {rank}] Exception ignored in: <module 'threading'" in text
        assert (tmp_path / f"atexit-rank-{rank}").read_text() == "ran"
    assert "ZeroDivisionError" in text
    assert_none_left()


def test_the_exit_is_refused_outside_the_main_thread():
    """threading._shutdown() joins every non-daemon thread: called from one, it would wait for itself for ever."""
    code = ("import threading\nfrom ppkit.transport.interpreter_exit import run_exit_functions\n"
            "said = []\n"
            "def call():\n    try:\n        run_exit_functions()\n"
            "    except RuntimeError as exc:\n        said.append(str(exc))\n"
            "t = threading.Thread(target=call, name='helper')\nt.start()\nt.join(10)\n"
            "print('alive' if t.is_alive() else said[0], flush=True)\nimport os\nos._exit(0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "called from thread 'helper'" in done.stdout and "Call it from the main thread" in done.stdout


def _leaves_a_thread_that_never_ends(i, folder):
    import threading
    import time

    def poll():
        while True:
            time.sleep(0.1)

    threading.Thread(target=poll, name="learner-poller").start()  # not a daemon: the exit waits for it
    (folder / f"started-{i}").write_text("returns")


def _names_the_thread(text: str) -> None:
    assert "the process waits, as Python does at exit, for non-daemon thread 'learner-poller' at " in text, text
    assert "make it daemon=True or stop it" in text, text
    assert "time.sleep(0.1)" in text, text  # where the thread is


def test_a_timeout_names_the_non_daemon_thread_the_exit_waits_for(tmp_path):
    with pytest.raises(ppkit.JobTimeoutError) as info:
        ppkit.spawn(_leaves_a_thread_that_never_ends, args=(tmp_path,), nprocs=2, timeout=10)
    text = str(info.value)
    _names_the_thread(text)
    assert "a collective that not every process called" not in text, text  # no collective is to blame
    assert_none_left()


def test_an_interrupt_names_the_non_daemon_thread_the_exit_waits_for(tmp_path):
    from test_spawn import _interrupt_when_started

    ppkit.spawn(lambda i: None, nprocs=2)  # the fork server is up: Ctrl-C lands in the wait for the ranks
    _interrupt_when_started(tmp_path, 2)
    with pytest.raises(ppkit.JobInterrupted) as info:
        ppkit.spawn(_leaves_a_thread_that_never_ends, args=(tmp_path,), nprocs=2)
    text = str(info.value)
    _names_the_thread(text)
    assert "e.g. in a collective" not in text, text
    assert_none_left()
