"""The learner's progress record (ppkit/progress/): two writers at once lose and interleave nothing, the
files rotate at their bound and stay private, the off switch writes nothing, and the reader survives
any garbage. Every test writes to its own tmp folder (PPKIT_RECORD_DIR), never the real home."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import time
from pathlib import Path

import pytest

from ppkit import progress
from ppkit.progress import format as fmt
from ppkit.progress import read, record


@pytest.fixture
def folder(tmp_path, monkeypatch):
    path = tmp_path / "ppkit-progress"
    monkeypatch.setenv(fmt.DIR_ENV, str(path))
    monkeypatch.delenv(fmt.SWITCH_ENV, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    return path


def _writer(folder: str, writer: int, lines: int, pad: int, go) -> None:
    go.wait()
    for i in range(lines):
        record.append("error", folder=Path(folder), error=f"W{writer}", message=f"{i} " + "x" * pad)


def _two_writers_at_once(folder, lines: int, pad: int) -> int:
    """Two processes append ``lines`` lines each at the same moment; the largest total size seen meanwhile."""
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(str(folder), w, lines, pad, go)) for w in (0, 1)]
    for p in procs:
        p.start()
    go.set()
    largest = 0
    while any(p.is_alive() for p in procs):
        largest = max(largest, _total_size(folder))
        time.sleep(0.002)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    return max(largest, _total_size(folder))


def _total_size(folder) -> int:
    size = 0
    for name in (fmt.CURRENT, fmt.OLD):
        try:
            size += os.stat(folder / name).st_size
        except FileNotFoundError:
            pass
    return size


def _sequences(folder, names=(fmt.OLD, fmt.CURRENT)) -> dict[str, list[int]]:
    """Each writer's line numbers, in the order of ``names`` and of lines; every line must be a whole event."""
    found: dict[str, list[int]] = {"W0": [], "W1": []}
    for name in names:
        path = folder / name
        if not path.exists():
            continue
        raw = path.read_bytes()
        assert raw.endswith(b"\n")
        for line in raw.split(b"\n")[:-1]:
            body = json.loads(line)  # an interleaved line would not parse
            assert body["v"] == 1 and body["kind"] == "error" and body["pid"] > 0
            found[body["error"]].append(int(body["message"].split()[0]))
    return found


def test_two_processes_appending_at_once_lose_and_interleave_no_line(folder, monkeypatch):
    monkeypatch.setattr(fmt, "MAX_FILE_BYTES", 64 * 1024 * 1024)  # no rotation here: every line stays
    _two_writers_at_once(folder, 2000, pad=20)
    assert _sequences(folder) == {"W0": list(range(2000)), "W1": list(range(2000))}
    assert not (folder / fmt.OLD).exists()


@pytest.mark.parametrize("bound", [fmt.MAX_FILE_BYTES, 16 * 1024], ids=["256KiB", "16KiB-many-rotations"])
def test_rotation_under_that_load_loses_no_line_and_stays_within_the_bound(folder, monkeypatch, bound):
    # A spy keeps each record.old.jsonl that a rotation replaces, with its size then, so that every line
    # written can be counted, and a line written to a file after it was rotated away (lost) is seen.
    replace = os.replace

    def keep_what_rotation_drops(src, dst):
        if Path(dst).name == fmt.OLD and Path(dst).exists():
            size = os.stat(dst).st_size
            replace(dst, Path(dst).with_name(f"dropped-{time.monotonic_ns():020d}-{os.getpid()}-{size}"))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", keep_what_rotation_drops)
    monkeypatch.setattr(fmt, "MAX_FILE_BYTES", bound)
    largest = _two_writers_at_once(folder, 2000, pad=300)  # about 1.6 MB written: rotated several times
    for name in (fmt.CURRENT, fmt.OLD):
        assert os.stat(folder / name).st_size <= bound
    assert largest <= 2 * bound  # about 512 KiB at the real bound, however the writers raced
    dropped = sorted(folder.glob("dropped-*"))
    assert len(dropped) >= 3
    assert [p.stat().st_size for p in dropped] == [int(p.name.rsplit("-", 1)[1]) for p in dropped]
    names = (*(p.name for p in dropped), fmt.OLD, fmt.CURRENT)
    assert _sequences(folder, names) == {"W0": list(range(2000)), "W1": list(range(2000))}


def test_folder_and_files_are_private_even_with_a_permissive_umask(folder, monkeypatch):
    old = os.umask(0)
    try:
        folder.mkdir(mode=0o777)  # made before, by someone, too open
        record.append("check", exercise="ring_shift", status="passed")
        monkeypatch.setattr(fmt, "MAX_FILE_BYTES", 600)
        for _ in range(4):
            record.append("check", exercise="ring_shift", status="failed", reason="r" * 200)
    finally:
        os.umask(old)
    assert (folder / fmt.OLD).exists()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    for name in (fmt.CURRENT, fmt.OLD):
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o600


def test_every_line_has_the_common_fields_and_the_kinds_own(folder, monkeypatch):
    monkeypatch.setenv("JPY_SESSION_NAME", "notebooks/02_collectives.ipynb")
    progress.note("check", exercise="ring_all_reduce", status="failed", reason="rank 1 got 3, expected 4")
    progress.note("cluster", state="hung", seconds=61.5, detail="every rank waits inside torch.distributed")
    progress.note("preflight", verdict="ready", summary="ppkit preflight: 11/11 ok")
    lines = [json.loads(line) for line in (folder / fmt.CURRENT).read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["check", "cluster", "preflight"]
    for line in lines:
        assert line["v"] == 1 and line["pid"] == os.getpid() and abs(line["t"] - time.time()) < 60
        assert line["notebook"] == "notebooks/02_collectives.ipynb"
    assert lines[0]["reason"] == "rank 1 got 3, expected 4" and lines[1]["seconds"] == 61.5


def test_a_long_text_is_cut_to_the_line_bound(folder):
    progress.note("error", error="RemoteError", message="é" * 5000)  # two bytes each in UTF-8
    raw = (folder / fmt.CURRENT).read_bytes()
    assert len(raw) <= fmt.MAX_LINE_BYTES and raw.count(b"\n") == 1
    assert json.loads(raw)["message"].endswith("é...")


def test_the_off_switch_in_the_environment_writes_nothing(folder, monkeypatch):
    monkeypatch.setenv(fmt.SWITCH_ENV, "off")
    progress.note("check", exercise="ring_shift", status="passed")
    assert not folder.exists()


def test_the_off_file_writes_nothing_until_removed(folder):
    record.switch(False)
    assert stat.S_IMODE(os.stat(folder / fmt.OFF).st_mode) == 0o600
    progress.note("check", exercise="ring_shift", status="passed")
    assert not (folder / fmt.CURRENT).exists()
    record.switch(True)
    progress.note("check", exercise="ring_shift", status="passed")
    assert len((folder / fmt.CURRENT).read_text().splitlines()) == 1


def test_a_failure_to_record_says_so_once_and_never_raises(tmp_path, monkeypatch, capsys):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv(fmt.DIR_ENV, str(blocked / "ppkit-progress"))
    monkeypatch.setattr(progress, "_failed_once", False)
    progress.note("check", exercise="ring_shift", status="passed")
    progress.note("error", error="ConfigError", message="bad")
    err = capsys.readouterr().err
    assert err.count("ppkit could not write your progress record") == 1
    assert fmt.DIR_ENV in err and "Your work is not affected" in err


# -- the reader ---------------------------------------------------------------------------------

def good(kind="check", **fields) -> str:
    body = {"v": 1, "t": 1000.0, "kind": kind, "notebook": "nb.ipynb", "pid": 7,
            **(fields or {"exercise": "ring_shift", "status": "passed"})}
    return json.dumps(body) + "\n"


def test_the_reader_counts_garbage_and_never_raises():
    old = (b"\x00\xff\xfe\x80 binary\n" + b"[1, 2, 3]\n" + good().encode() + b'"a string"\n'
           + good(error="E", message="m").encode()  # an "check" without its fields
           + json.dumps({"v": 2, "t": 1, "kind": "check"}).encode() + b"\n"
           + json.dumps({"v": 1, "t": 1, "kind": "party", "notebook": None, "pid": 1}).encode() + b"\n"
           + b"{" * 100000 + b"\n")
    current = good(kind="cluster", state="died", detail="rank 1 exited with code 7") + "y" * (5 << 20) + "\n" \
        + good(exercise="ring_shift", status="failed", reason="rank 0 got 1") + '{"v": 1, "t": 5, "ki'
    found = read.parse(old, current)
    assert found.bad_lines == {
        "not JSON": 1, "not a JSON object": 2, "without the fields of a 'check' line": 1,
        "of an unknown version (not v 1)": 1, "of an unknown kind": 1,
        f"longer than {fmt.MAX_LINE_BYTES} bytes": 1, "cut short at the end of a file": 1}
    assert found.oversized == [fmt.CURRENT]  # 5 MiB: only its end was read, and the record says so
    assert [e.kind for e in found.events] == ["check", "check"]  # the cluster line was before the end read
    state = found.notebooks[0].exercises[0]
    assert (state.status, state.checks, state.failures, state.reason) == ("passed", 2, 1, "rank 0 got 1")
    assert state.failed_since_pass  # passed, then failed: still passed, with the failure shown as later
    shown = json.loads(found.to_json())
    assert shown["problems"] and shown["notebooks"][0]["notebook"] == "nb.ipynb"


@pytest.mark.parametrize("text", [None, "", b"", "\n\n", "\u2028\n", b"\xff" * 3000, "{}", "null\n",
                                  '{"v": 1, "t": "soon", "kind": "check", "exercise": "x", "status": "passed"}\n',
                                  '{"v": 1, "t": NaN, "kind": "error", "error": "E", "message": "m"}\n',
                                  '{"v": true, "t": 1, "kind": "error", "error": "E", "message": "m"}\n',
                                  '{"v": 1, "t": 1, "kind": "cluster", "state": "melted", "detail": "d"}\n',
                                  '{"v": 1, "t": 1, "kind": "cluster", "state": "hung", "detail": "d", '
                                  '"seconds": "long"}\n'])
def test_no_text_makes_the_reader_raise(text):
    for old, current in ((text, None), (None, text), (text, text)):
        found = read.parse(old, current)
        assert found.events == [] and found.notebooks == []
        json.loads(found.to_json())


def test_the_reader_summarises_per_notebook_in_time_order():
    lines = [
        {"t": 3, "kind": "check", "exercise": "ring_shift", "status": "passed"},
        {"t": 1, "kind": "check", "exercise": "ring_shift", "status": "failed", "reason": "wrong"},
        {"t": 2, "kind": "error", "error": "ExerciseFailed", "message": "wrong"},
        {"t": 4, "kind": "cluster", "state": "hung", "seconds": 60.0, "detail": "rank 0 in recv"},
        {"t": 5, "kind": "preflight", "verdict": "warnings", "summary": "11/11 ok, 1 warning", "notebook": None},
        {"t": 6, "kind": "check", "exercise": "my_share", "status": "not written", "notebook": "other.ipynb"},
    ]
    text = [json.dumps({"v": 1, "notebook": "nb.ipynb", "pid": 1, **line}) + "\n" for line in lines]
    found = read.parse("".join(text[:3]), "".join(text[3:]))  # the old file, then the current one
    first, other = found.notebooks
    assert first.notebook == "nb.ipynb" and other.with_status("not written") == ["my_share"]
    state = first.exercises[0]
    assert (state.status, state.failed_t, state.passed_t, state.reason) == ("passed", 1, 3, "wrong")
    assert first.last_error.error == "ExerciseFailed" and first.errors == 1
    assert (first.last_cluster.state, first.last_cluster.seconds) == ("hung", 60.0)
    assert found.preflight.verdict == "warnings" and found.bad_lines == {}


def test_read_folder_reads_only_the_end_of_a_huge_file(folder):
    folder.mkdir()
    (folder / fmt.CURRENT).write_bytes(b"z" * (6 << 20) + b"\n" + good().encode())
    found = read.read_folder()
    assert found.oversized == [fmt.CURRENT] and len(found.events) == 1
    assert found.bad_lines == {}  # the cut line before it is skipped, not counted as garbage


@pytest.mark.parametrize("message, line", [
    ("ring_shift: 2 problem(s) in 3 cases:\n  - rank 1 got 0, expected 3\n  - rank 2 ...",
     "ring_shift: 2 problem(s) in 3 cases: - rank 1 got 0, expected 3"),
    ("\n\nrank 1 exited with code 7\nmore", "rank 1 exited with code 7"),
    ("ends with a colon:", "ends with a colon:"),
    ("", ""),
])
def test_the_one_line_of_a_message_says_what_went_wrong(message, line):
    assert fmt.first_line(message) == line
