"""Which Python / torch / torchvision combinations ppkit really works with: a fresh venv per entry, a smoke run.

    python scripts/version_matrix.py                       # every entry of MATRIX (about 5 min each)
    python scripts/version_matrix.py --only 3.11:2.8.0     # one entry
    python scripts/version_matrix.py --markdown docs/versions.md

For each entry: a new venv with that Python, ``pip install torch==T torchvision==V`` (plus ppkit's small
dependencies; numpy<2 where the torch predates numpy 2), ppkit itself with ``--no-deps -e`` from this
checkout, then the smoke steps, each in its own process with a time limit so that nothing hangs:
cluster, collectives, RPC world re-init (scripts/version_smoke.py), and ``ppkit pipeline --verify`` with
the RPC schedule, GPipe and 1F1B. One table row per entry; the log of each step goes to the work folder.

Not part of ``make test`` (CI runs the pinned pair only): it downloads several GB per entry. The result
table, as run, is in docs/versions.md; pyproject.toml, environment.yml and README.md claim exactly what
passed there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"

# (python, torch, torchvision): the oldest pair the package claimed, one in the middle, the pinned one;
# and the pinned one (or the newest one with a wheel) on every other Python the registries offer.
MATRIX = [
    ("3.11", "2.2.2", "0.17.2"),
    ("3.11", "2.5.1", "0.20.1"),
    ("3.11", "2.8.0", "0.23.0"),
    ("3.11", "2.9.1", "0.24.1"),
    ("3.11", "2.10.0", "0.25.0"),
    ("3.11", "2.11.0", "0.26.0"),
    ("3.11", "2.12.1", "0.27.1"),
    ("3.11", "2.14.1", "0.29.1"),
    ("3.9", "2.8.0", "0.23.0"),
    ("3.10", "2.14.1", "0.29.1"),
    ("3.12", "2.14.1", "0.29.1"),
    ("3.13", "2.14.1", "0.29.1"),
]
SMALL_DEPS = ["cloudpickle", "matplotlib", "psutil"]
PIPE = ["--batch-size", "8", "--image-size", "32", "--num-batches", "1", "--verify"]
STEPS = [
    ("cluster", ["scripts/version_smoke.py", "cluster"]),
    ("collectives", ["scripts/version_smoke.py", "collectives"]),
    ("rpc re-init", ["scripts/version_smoke.py", "rpc_reinit"]),
    ("pipeline --verify", ["-m", "ppkit", "pipeline", "--microbatch-sizes", "4", *PIPE]),
    ("gpipe --verify", ["-m", "ppkit", "pipeline", "--schedule", "gpipe", "--microbatch-sizes", "4", *PIPE]),
    ("1f1b --verify", ["-m", "ppkit", "pipeline", "--schedule", "1f1b", "--microbatch-sizes", "2", *PIPE]),
]
STEP_LIMIT_S = 240


def python_for(version: str) -> Path | None:
    """The newest pyenv interpreter of this minor version (3.11 -> .../3.11.7/bin/python), or None."""
    found = sorted((p for p in PYENV.glob(f"{version}.*") if p.name.split(".")[1] == version.split(".")[1]),
                   key=lambda p: tuple(int(x) for x in p.name.split(".") if x.isdigit()))
    return found[-1] / "bin" / "python" if found else None


def numpy_pin(torch_version: str) -> str:
    """torch before 2.3 was built against numpy 1 and cannot use numpy 2 ('Numpy is not available')."""
    major, minor = (int(x) for x in torch_version.split(".")[:2])
    return "numpy<2" if (major, minor) < (2, 3) else "numpy"


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:160] if lines else ""


def run_entry(py: str, torch_v: str, tv_v: str, work: Path, keep: bool) -> dict:
    row = {"python": py, "torch": torch_v, "torchvision": tv_v, "steps": {}, "note": ""}
    interp = python_for(py)
    if interp is None:
        row["note"] = f"no Python {py} on this machine"
        return row
    venv = work / f"py{py}-torch{torch_v}"
    log_dir = work / "logs" / venv.name
    log_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(venv, ignore_errors=True)
    t0 = time.monotonic()
    try:
        subprocess.run([str(interp), "-m", "venv", str(venv)], check=True)
        vpy = str(venv / "bin" / "python")
        pip = [vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        install = subprocess.run(pip + [f"torch=={torch_v}", f"torchvision=={tv_v}", numpy_pin(torch_v),
                                        *SMALL_DEPS], capture_output=True, text=True)
        (log_dir / "install.log").write_text(install.stdout + install.stderr)
        if install.returncode != 0:
            row["note"] = "install failed: " + last_line(install.stderr)
            return row
        subprocess.run(pip + ["--no-deps", "-e", str(ROOT)], check=True, capture_output=True)
        versions = subprocess.run([vpy, "-c", "import sys, torch, torchvision; print(sys.version.split()[0], "
                                   "torch.__version__, torchvision.__version__)"], capture_output=True, text=True)
        row["note"] = f"installed {versions.stdout.strip()} in {time.monotonic() - t0:.0f} s"
        for name, args in STEPS:
            t1 = time.monotonic()
            try:
                done = subprocess.run([vpy, *args], cwd=ROOT, capture_output=True, text=True, timeout=STEP_LIMIT_S,
                                      env={**os.environ, "PYTHONPATH": "", "PYTHONUNBUFFERED": "1"})
                out, code = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired as e:
                out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
                code = None
            (log_dir / f"{name.split()[0]}.log").write_text(out)
            secs = time.monotonic() - t1
            if code == 0:
                row["steps"][name] = f"ok ({secs:.0f} s)"
            elif code is None:
                row["steps"][name] = f"HUNG (killed after {STEP_LIMIT_S} s)"
            else:
                failed = [line for line in out.splitlines() if line.startswith("FAILED:")]
                row["steps"][name] = "FAIL: " + (failed[-1][8:] if failed else last_line(out))
            print(f"  {py} torch {torch_v}: {name}: {row['steps'][name]}", flush=True)
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)
    return row


def markdown(rows) -> str:
    names = [name for name, _ in STEPS]
    lines = ["| Python | torch | torchvision | " + " | ".join(names) + " |",
             "| --- | --- | --- | " + " | ".join("---" for _ in names) + " |"]
    for row in rows:
        cells = [row["steps"].get(n, "not run") for n in names]
        cells = ["ok" if c.startswith("ok") else c.replace("|", "/") for c in cells]
        lines.append(f"| {row['python']} | {row['torch']} | {row['torchvision']} | " + " | ".join(cells) + " |")
    notes = [f"- {r['python']} / torch {r['torch']}: {r['note']}" for r in rows if r["note"]]
    return "\n".join(lines + [""] + notes) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", metavar="PY:TORCH", help="run only this entry (repeatable)")
    parser.add_argument("--work", default="/tmp/ppkit-version-matrix", help="where venvs and logs go")
    parser.add_argument("--keep", action="store_true", help="keep each venv (several GB each)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the table to PATH")
    args = parser.parse_args(argv)
    entries = [e for e in MATRIX if not args.only or f"{e[0]}:{e[1]}" in args.only]
    if not entries:
        parser.error(f"--only {args.only}: no such entry; entries: {[f'{e[0]}:{e[1]}' for e in MATRIX]}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for py, torch_v, tv_v in entries:
        print(f"Python {py}, torch {torch_v}, torchvision {tv_v}", flush=True)
        rows.append(run_entry(py, torch_v, tv_v, work, args.keep))
    table = markdown(rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table)
    return 0 if all(v.startswith("ok") for r in rows for v in r["steps"].values()) and all(
        len(r["steps"]) == len(STEPS) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
