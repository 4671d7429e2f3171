"""Each notebook's peak memory: the kernel and every process it starts (workers, fork server, RPC agents).

    python benchmarks/bench_memory.py                          # every notebook in notebooks/
    python benchmarks/bench_memory.py notebooks/06_pipeline.ipynb --interval 0.1 --out table.md --json rows.json

Each notebook runs top to bottom in a fresh kernel (nbclient, as nbval runs it). A thread samples, every
``--interval`` seconds, the kernel's process and all its descendants from /proc:

- RSS sum: resident memory summed over the processes. Forked workers share the fork server's pages (torch's
  libraries), so the sum counts those pages once per process: an upper bound.
- PSS sum: proportional set size summed (a shared page split among the processes that map it): close to
  what the machine really spends.
- largest process: the biggest single RSS seen.
- cgroup peak: where this machine lets the benchmark make a memory cgroup (root; tests/memcg.py), the kernel
  starts inside a cgroup of its own and this is the most memory the kernel charged to it at once
  (what a learner's memory limit is compared with, page cache and /dev/shm included).
- /dev/shm: run as root, the benchmark gives itself a private, empty /dev/shm (a new mount namespace with a
  fresh tmpfs), so its peak use is this notebook's alone; otherwise the machine's /dev/shm use above what it
  was at the start (other users' files count too; the table says which).

Run times are wall-clock on whatever else the machine is doing; the memory is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the cgroup helper the OOM test uses

from memcg import CgroupUnavailable, MemoryCgroup  # noqa: E402

from ppkit.notebook_memory import MIB, NotebookMemory, markdown_row, markdown_table  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
PRIVATE_SHM = "PPKIT_BENCH_PRIVATE_SHM"  # set in the re-executed benchmark that mounted its own /dev/shm
# The kernel joins the cgroup named in argv[1], then becomes ipykernel (so nothing else is charged to it).
JOIN_THEN_KERNEL = ("import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); "
                    "os.execv(sys.executable, [sys.executable, '-m', 'ipykernel_launcher', *sys.argv[2:]])")


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, from each process's parent in /proc/N/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def rss_and_pss(pid: int) -> tuple[int, int]:
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        pss = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
        return rss, pss
    except (OSError, ValueError, IndexError):  # it ended between the listing and the read
        return 0, 0


def shm_used() -> int:
    stats = os.statvfs("/dev/shm")
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


class Sampler(threading.Thread):
    """Samples the tree below the kernel until stopped; keeps the peaks."""

    def __init__(self, client, interval: float):
        super().__init__(daemon=True, name="memory-sampler")
        self.client, self.interval = client, interval
        self.stop = threading.Event()
        self.rss_sum = self.pss_sum = self.largest = self.processes = 0
        self.shm_start = shm_used()
        self.shm_peak = 0

    def kernel_pid(self) -> int | None:
        km = getattr(self.client, "km", None)
        provisioner = getattr(km, "provisioner", None)
        return getattr(provisioner, "pid", None)

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            pid = self.kernel_pid()
            if pid is None:
                continue
            sizes = [rss_and_pss(p) for p in descendants(pid)]
            rss = sum(r for r, _ in sizes)
            if rss > self.rss_sum:
                self.rss_sum, self.processes = rss, sum(r > 0 for r, _ in sizes)
            self.pss_sum = max(self.pss_sum, sum(p for _, p in sizes))
            self.largest = max([self.largest, *(r for r, _ in sizes)])
            self.shm_peak = max(self.shm_peak, shm_used() - self.shm_start)


def kernel_spec(folder: Path, procs: Path | None) -> str:
    """A kernelspec in ``folder`` (on JUPYTER_PATH) whose kernel first joins ``procs``' cgroup."""
    if procs is None:
        return "python3"
    spec = folder / "kernels" / "ppkit-measured"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-c", JOIN_THEN_KERNEL, str(procs), "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "measured", "language": "python"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("JUPYTER_PATH")]))
    return "ppkit-measured"


def measure(notebook: Path, interval: float, timeout: float, use_cgroup: bool,
            limit_mib: int | None = None) -> tuple[NotebookMemory, str]:
    """The notebook's peaks, and "" or the error that stopped it (a cell that raised, or killed for memory)."""
    import nbformat
    from nbclient import NotebookClient

    group, folder = None, Path(tempfile.mkdtemp(prefix="ppkit-bench-memory-"))
    if use_cgroup:
        try:
            group = MemoryCgroup(f"bench-{notebook.stem[:2]}", None if limit_mib is None else limit_mib * MIB)
        except CgroupUnavailable as exc:
            print(f"# no cgroup peak for {notebook.name}: {exc}", file=sys.stderr)
    try:
        nb = nbformat.read(notebook, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_spec(folder, group and group.procs),
                                resources={"metadata": {"path": str(notebook.parent)}})
        sampler = Sampler(client, interval)
        sampler.start()
        started, error = time.monotonic(), ""
        try:
            client.execute()
        except Exception as exc:  # noqa: BLE001 - a failing notebook is a row that says so
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:200]
        seconds = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
        peak = group.peak() if group is not None else None
    finally:
        if group is not None:
            group.close()
        shutil.rmtree(folder, ignore_errors=True)
    mib = lambda n: round(n / MIB)  # noqa: E731
    return NotebookMemory(notebook.name, mib(sampler.rss_sum), mib(sampler.pss_sum), mib(sampler.largest),
                          sampler.processes, None if peak is None else mib(peak), mib(sampler.shm_peak),
                          round(seconds, 1)), error


def in_private_shm(argv: list[str]) -> int | None:
    """As root, run this benchmark again in a new mount namespace with an empty /dev/shm of its own;
    its exit code, or None where that cannot be done (then /dev/shm is the machine's)."""
    if os.environ.get(PRIVATE_SHM) or os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    mount = "mount -t tmpfs -o size=8g,mode=1777 ppkit-bench-shm /dev/shm"
    script = f'{mount} && exec "$@"'
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", sys.executable, *argv]
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", mount],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"# /dev/shm is the machine's: cannot mount a private one ({probe.stderr.strip()})", file=sys.stderr)
        return None
    return subprocess.call(command, env={**os.environ, PRIVATE_SHM: "1"})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in notebooks/")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples (default 0.1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one cell may take (default 600)")
    parser.add_argument("--no-cgroup", action="store_true", help="do not make a memory cgroup for the kernel")
    parser.add_argument("--limit-mib", type=int, help="give that cgroup this memory limit (to check a need)")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    code = in_private_shm([str(Path(__file__).resolve()), *argv])
    if code is not None:
        return code
    notebooks = args.notebooks or sorted((REPO / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    shm = "a private /dev/shm" if os.environ.get(PRIVATE_SHM) else "the machine's /dev/shm (others' use counts)"
    print(f"# {len(notebooks)} notebook(s); every {args.interval:g} s; {shm}; {os.cpu_count()} cores", flush=True)
    rows, errors = [], {}
    for notebook in notebooks:
        row, error = measure(notebook.resolve(), args.interval, args.timeout, not args.no_cgroup, args.limit_mib)
        rows.append(row)
        print(markdown_row(row) + (f" FAILED: {error}" if error else ""), flush=True)
        if error:
            errors[row.notebook] = error
    text = markdown_table(rows)
    print(text + "".join(f"\n{name} FAILED: {error}" for name, error in errors.items()))
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "error": errors.get(r.notebook, "")} for r in rows], indent=1))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
