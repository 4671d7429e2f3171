"""The memory limit and /dev/shm as ppkit reads them, bad input included, and preflight's memory check.

Cgroup trees here are folders made by the test (``root``), with a /proc/self/cgroup of its own (``proc``);
the real out-of-memory kill is tests/test_memory_oom.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from ppkit.cluster.memory import MemoryLimit, ShmSize, parse_bytes, read_memory_limit, read_shm
from ppkit.cluster.oom import OomWatch, kill_count
from ppkit.notebook_memory import MEASURED, MIB, NotebookMemory, markdown_table
from ppkit.preflight_memory import memory_verdict

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


def v1_tree(tmp_path: Path, own: str = "limit_in_bytes", parent: str | None = None) -> tuple[Path, Path]:
    """A v1 memory hierarchy with this process in /learner (its limit file holding ``own``)."""
    folder = tmp_path / "memory" / "learner"
    folder.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (folder / "memory.limit_in_bytes").write_text(own)
    if parent is not None:
        (tmp_path / "memory" / "memory.limit_in_bytes").write_text(parent)
    (folder / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("5:cpu:/\n4:memory:/learner\n0::/\n")
    return tmp_path, proc


def v2_tree(tmp_path: Path, own: str, parent: str = "max") -> tuple[Path, Path]:
    folder = tmp_path / "user.slice" / "jupyter-ana.service"
    folder.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "user.slice" / "memory.max").write_text(parent + "\n")
    (folder / "memory.max").write_text(own + "\n")
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/user.slice/jupyter-ana.service\n")
    return tmp_path, proc


def test_v2_takes_the_smallest_limit_on_the_way_up(tmp_path):
    root, proc = v2_tree(tmp_path, "max", parent=str(3 * GIB))
    limit = read_memory_limit({}, root, physical=64 * GIB, proc=proc)
    assert limit.bytes == 3 * GIB and limit.limited and "user.slice/memory.max" in limit.source
    assert limit.cgroup == root / "user.slice" / "jupyter-ana.service" and limit.version == 2
    assert kill_count(limit.cgroup, limit.version) == 1


def test_v1_limit_and_oom_count(tmp_path):
    root, proc = v1_tree(tmp_path, str(2 * GIB))
    limit = read_memory_limit({}, root, physical=64 * GIB, proc=proc)
    assert (limit.bytes, limit.version) == (2 * GIB, 1) and str(limit) == f"2.0 GiB (cgroup {limit.cgroup}" \
        "/memory.limit_in_bytes)"
    assert kill_count(limit.cgroup, 1) == 3


def test_no_limit_anywhere_is_the_machines_memory(tmp_path):
    root, proc = v1_tree(tmp_path, "9223372036854771712")
    limit = read_memory_limit({}, root, physical=16 * GIB, proc=proc)
    assert limit.bytes == 16 * GIB and not limit.limited and limit.source == "the machine's memory"
    assert limit.notes == ()


def test_mem_limit_from_the_spawner_counts_when_smaller(tmp_path):
    root, proc = v2_tree(tmp_path, str(8 * GIB))
    assert read_memory_limit({"MEM_LIMIT": str(4 * GIB)}, root, 64 * GIB, proc).bytes == 4 * GIB
    assert read_memory_limit({"MEM_LIMIT": "2G"}, root, 64 * GIB, proc).source.startswith("MEM_LIMIT=2G")
    assert read_memory_limit({"MEM_LIMIT": str(16 * GIB)}, root, 64 * GIB, proc).bytes == 8 * GIB


@pytest.mark.parametrize("value", ["abc", "0", "-1", "", "4 gigs", "nan", "1e400"])
def test_bad_mem_limit_is_a_note_saying_what_was_read_and_used(tmp_path, value):
    root, proc = v2_tree(tmp_path, str(8 * GIB))
    limit = read_memory_limit({"MEM_LIMIT": value}, root, 64 * GIB, proc)
    assert limit.bytes == 8 * GIB  # the cgroup's, used instead
    if value:  # an empty MEM_LIMIT is no MEM_LIMIT
        assert limit.notes == (f"MEM_LIMIT={value!r} is not a positive number of bytes; ignored",)


@pytest.mark.parametrize("text", ["abc", "", "-5", "12 34"])
def test_odd_cgroup_file_is_a_note_and_the_next_limit_is_used(tmp_path, text):
    root, proc = v2_tree(tmp_path, text, parent=str(6 * GIB))
    limit = read_memory_limit({}, root, 64 * GIB, proc)
    assert limit.bytes == 6 * GIB
    assert len(limit.notes) == 1 and "jupyter-ana.service/memory.max" in limit.notes[0]
    assert repr(text) in limit.notes[0] and "ignored" in limit.notes[0]


def test_unreadable_cgroup_file_is_a_note(tmp_path):
    root, proc = v1_tree(tmp_path, "x")
    limit_file = root / "memory" / "learner" / "memory.limit_in_bytes"
    limit_file.unlink()
    limit_file.mkdir()  # reading a folder fails for root too (chmod 000 would not stop root)
    limit = read_memory_limit({"MEM_LIMIT": "3G"}, root, 64 * GIB, proc)
    assert limit.bytes == 3 * GIB
    assert limit.notes and limit.notes[0].startswith(f"cannot read {limit_file}")


def test_unreadable_proc_cgroup_and_odd_oom_counts_do_not_crash(tmp_path):
    limit = read_memory_limit({}, tmp_path, 8 * GIB, proc=tmp_path / "missing")
    assert limit.bytes == 8 * GIB and limit.cgroup is None
    assert kill_count(None, None) is None
    (tmp_path / "memory.events").write_text("oom_kill lots\n")
    assert kill_count(tmp_path, 2) is None
    watch = OomWatch(limit, None)
    assert "cgroup does not say" in watch.explain(signal.SIGKILL)  # wait status of a SIGKILL
    assert watch.explain(None) == "" and watch.explain(1 << 8) == ""  # no signal: nothing to add


def test_oom_watch_names_a_rise_in_the_count(tmp_path):
    root, proc = v2_tree(tmp_path, str(2 * GIB))
    watch = OomWatch.start(read_memory_limit({}, root, 64 * GIB, proc))
    assert "not by the out-of-memory killer" in watch.explain(signal.SIGKILL)
    (watch.limit.cgroup / "memory.events").write_text("oom 2\noom_kill 2\n")
    words = watch.explain(signal.SIGKILL)
    assert "OUT OF MEMORY" in words and "1 kill(s)" in words and "2.0 GiB" in words
    assert watch.explain(signal.SIGTERM) == ""
    unknown = watch.explain(None)  # the exit status was not reported in time, but the count rose
    assert "rose by 1" in unknown and "most likely killed for lack of memory" in unknown and "2.0 GiB" in unknown
    assert "OUT OF MEMORY" in unknown and "exit status was not reported" in unknown


def test_parse_bytes_units():
    notes: list[str] = []
    assert parse_bytes("512M", "x", notes) == 512 * MIB and parse_bytes("1.5G", "x", notes) == 3 * GIB // 2
    assert parse_bytes("2GiB", "x", notes) == 2 * GIB and parse_bytes("4096", "x", notes) == 4096
    assert notes == []


def test_shm_size_is_read_and_an_unreadable_one_is_a_note(tmp_path):
    assert read_shm(tmp_path).total > 0
    missing = read_shm(tmp_path / "nowhere")
    assert missing.total is None and "cannot read" in missing.notes[0]


ROWS = (NotebookMemory("00_start_here.ipynb", 3000, 1600, 870, 5, 1500, 0, 100.0),
        NotebookMemory("06_pipeline.ipynb", 5000, 2900, 1500, 6, 3000, 40, 80.0))


def test_verdict_every_notebook_fits():
    verdict = memory_verdict(MemoryLimit(16 * GIB, "cgroup x"), ShmSize(GIB, GIB), ROWS)
    assert verdict.status == "ok" and "every notebook fits" in verdict.detail and verdict.too_big == ()


def test_verdict_names_the_notebooks_that_do_not_fit_and_what_to_ask_for():
    # 06 needs max(2900, 3000) * 1.25 = 3750 -> 3840 MiB; its 40 MiB of /dev/shm * 1.25 = 50 -> 64 MiB
    verdict = memory_verdict(MemoryLimit(3 * GIB, "MEM_LIMIT=3G"), ShmSize(48 * MIB, 48 * MIB), ROWS)
    assert verdict.status == "warn" and verdict.too_big == ("06_pipeline.ipynb",)
    assert "need more memory than the limit: 06" in verdict.detail and "need more /dev/shm: 06" in verdict.detail
    assert "memory limit of at least 3.8 GiB (for 06_pipeline.ipynb)" in verdict.fix
    assert "/dev/shm of at least 64 MiB" in verdict.fix and "--shm-size" in verdict.fix


def test_verdict_fails_when_nothing_fits_and_keeps_the_notes():
    limit = MemoryLimit(GIB, "cgroup y", notes=("MEM_LIMIT='abc' is not a positive number of bytes; ignored",))
    verdict = memory_verdict(limit, ShmSize(None, None, ("cannot read /dev/shm's size",)), ROWS)
    assert verdict.status == "FAIL" and "MEM_LIMIT='abc'" in verdict.detail and "cannot read" in verdict.detail
    ok = memory_verdict(MemoryLimit(16 * GIB, "x", notes=("odd",)), ShmSize(GIB, GIB), ROWS)
    assert ok.status == "warn"  # fits, but what was read was odd
    assert memory_verdict(MemoryLimit(16 * GIB, "x"), ShmSize(GIB, GIB), ()).status == "warn"  # nothing measured


def test_the_packaged_table_is_the_one_in_docs_memory_md():
    docs = (REPO / "docs" / "memory.md").read_text()
    assert MEASURED, "ppkit/notebook_memory.py holds no measurements"
    assert markdown_table() in docs, "docs/memory.md's table differs from ppkit.notebook_memory.MEASURED"
    shown = re.findall(r"^\| (\d\d[a-z]?_\w+\.ipynb) \|", docs, re.MULTILINE)
    assert shown == [n.notebook for n in MEASURED]


def test_every_notebook_is_measured():
    notebooks = sorted(p.name for p in (REPO / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    missing = sorted(set(notebooks) - {n.notebook for n in MEASURED})
    assert not missing, (f"run benchmarks/bench_memory.py {' '.join(missing)} and add its rows to "
                         "ppkit/notebook_memory.py and docs/memory.md")


@pytest.mark.slow
def test_the_benchmark_sees_memory_a_child_of_the_kernel_takes(tmp_path):
    """bench_memory.py on a notebook whose kernel starts a process holding 300 MiB, then writes 64 MiB to
    /dev/shm for a second: the RSS sum and the largest process include the first, the /dev/shm peak the
    second; its --json rows are NotebookMemory's fields (plus the error), as pasted."""
    import subprocess
    import sys

    import nbformat

    cells = ["import os, subprocess, sys, time",
             "child = subprocess.Popen([sys.executable, '-c', 'b = bytearray(300 * 2**20); import time; "
             "time.sleep(3)']); child.wait()",
             f"path = '/dev/shm/ppkit-test-{os.getpid()}'; open(path, 'wb').write(bytes(64 * 2**20)); "
             "time.sleep(1); os.remove(path)"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, tmp_path / "99_holds.ipynb")
    bench = [sys.executable, str(REPO / "benchmarks" / "bench_memory.py"), str(tmp_path / "99_holds.ipynb")]
    done = subprocess.run([*bench, "--json", str(tmp_path / "rows.json")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    row = json.loads((tmp_path / "rows.json").read_text())[0]
    assert row.pop("error") == ""
    measured = NotebookMemory(**row)
    assert measured.largest_process_mib >= 300 and measured.rss_sum_mib >= 300 + 30  # the child and the kernel
    assert measured.processes >= 2 and measured.shm_peak_mib >= 64
    assert measured.cgroup_peak_mib is None or measured.cgroup_peak_mib >= 300
    assert "| 99_holds.ipynb |" in done.stdout
