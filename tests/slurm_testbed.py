"""A real two-node SLURM cluster on this machine, for tests: its own munged, slurmctld and two slurmd.

    with SlurmTestbed() as tb:                       # a few seconds; both nodes idle on return
        tb.run(["srun", "-N", "2", "-n", "4", "hostname"])
        os.environ.update(tb.env)                    # now plain `sbatch` / `srun` use this cluster

Everything lives in one temporary directory (munge key and socket, slurm.conf, state, spool, logs,
pid files), every port is a free one, so several testbeds (other sessions' included) coexist.
Nodes n1 and n2 (CPUs=4 each, NodeAddr=127.0.0.1, one slurmd each on its own port) are in
partition ``debug`` (default, MaxTime=01:00:00); partition ``one`` has n1 only (tests/slurm_conf.py).
The names n1/n2 do not resolve by DNS: code must use NodeAddr (``scontrol show node``).

``stop()`` cancels what is still queued, then stops, politely then firmly, every daemon it
started, every slurmstepd they started and every task of this cluster's jobs; it is idempotent
and also runs after a start that failed. A plain module (not conftest.py) so tests/conftest.py
and the repository's conftest.py import the same one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psutil
import slurm_procs
from slurm_conf import NODES, render_slurm_conf

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")
INSTALL_HINT = "install them with `make slurm` (apt-get install slurmctld slurmd slurm-client munge, as root)"
START_TIMEOUT = 30.0  # s; a fresh testbed is usually idle within a second


class SlurmTestbedError(RuntimeError):
    """The testbed could not start, a command against it failed, or it left a process behind."""


class SlurmMissing(SlurmTestbedError):
    """SLURM or munge is not installed here (tests skip, or fail under CI=true)."""


def find_binaries() -> dict[str, str]:
    """Full paths of the daemons and clients the testbed uses; SlurmMissing names any that is missing."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/local/sbin"])
    found = {name: shutil.which(name, path=path) for name in (*DAEMONS, *CLIENTS)}
    missing = [name for name, where in found.items() if where is None]
    if missing:
        raise SlurmMissing(f"SLURM test cluster unavailable: {', '.join(missing)} not found; {INSTALL_HINT}.")
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that are free right now (held together so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SlurmTestbed:
    """One slurmctld, slurmd n1 and n2, and a munged, in a fresh temporary directory.

    Attributes once started: ``env`` ({"SLURM_CONF": ...}: add it to os.environ, or a subprocess's
    env, to use this cluster), ``conf_path``, ``tmpdir`` (logs: ``log_tail(name)``), ``ctld_port``,
    ``node_ports``. Set PPKIT_SLURM_KEEP=1 (or keep_dir=True) to keep the directory after stop().
    """

    def __init__(self, *, keep_dir: bool = False):
        self.bin = find_binaries()
        self.keep_dir = keep_dir or os.environ.get("PPKIT_SLURM_KEEP") == "1"
        self.tmpdir: Path | None = None
        self.conf_path: Path | None = None
        self.env: dict[str, str] = {}
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._slurmd_launched: dict[str, datetime] = {}
        self._started = self._stopped = False

    # --- lifecycle

    def __enter__(self) -> SlurmTestbed:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = START_TIMEOUT) -> SlurmTestbed:
        """Start munged, slurmctld and both slurmd; return once sinfo shows n1 and n2 idle."""
        if self._started:
            raise SlurmTestbedError("this SlurmTestbed was already started; create a new one for a fresh cluster")
        self._started = True
        try:
            self._prepare()
            deadline = time.monotonic() + timeout
            self._start_munged(deadline)
            self._spawn("slurmctld", [self.bin["slurmctld"], "-D", "-i", "-f", str(self.conf_path)])
            for node in NODES:
                self._start_slurmd_process(node)
            self._wait_ctld(deadline)
            for node in NODES:
                self._wait_node_idle(node, deadline)
        except BaseException as exc:
            tails = self._all_tails() if self.tmpdir else ""
            self.stop()
            if not isinstance(exc, Exception):
                raise
            what = exc if isinstance(exc, SlurmTestbedError) else f"SLURM test cluster failed to start: {exc!r}"
            keep = "" if self.keep_dir else " (PPKIT_SLURM_KEEP=1 keeps its directory for a look)"
            raise SlurmTestbedError(f"{what}{keep}\n{tails}") from exc
        return self

    def stop(self) -> None:
        """Cancel queued jobs, stop every daemon, slurmstepd and job task of this cluster; idempotent."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        try:
            self._cancel_all_jobs()
        finally:
            slurm = [name for name in self._procs if name != "munged"]
            self._stop_daemons(slurm)
            slurm_procs.kill_all(self._cluster_processes())
            self._stop_daemons(["munged"])
            left = [p for p in self._cluster_processes() if slurm_procs.alive(p)]
            left += [p for p in self._procs.values() if p.poll() is None]
            if self.tmpdir and not self.keep_dir and not left:
                shutil.rmtree(self.tmpdir, ignore_errors=True)
        if left:
            raise SlurmTestbedError(f"SLURM testbed {self.tmpdir}: processes survived SIGKILL: {left}")

    # --- using the cluster

    def run(self, args: list[str], *, check: bool = False, timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
        """Run a SLURM client (``["sinfo", "-N"]``) against this cluster; text output captured unless ``kw`` says.

        ``env`` (default os.environ) gets this cluster's variables on top. ``check=True`` raises
        SlurmTestbedError with the command's stderr and slurmctld's log tail.
        """
        cmd = [self.bin.get(args[0], args[0]), *args[1:]]
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        env = {**(kw.pop("env", None) or os.environ), **self.env}
        try:
            done = subprocess.run(cmd, env=env, timeout=timeout, **kw)
        except subprocess.TimeoutExpired as exc:
            raise SlurmTestbedError(
                f"`{' '.join(args)}` did not finish within {timeout:g} s against the SLURM testbed in {self.tmpdir};"
                f" is slurmctld alive?\n{self.log_tail('slurmctld')}"
            ) from exc
        if check and done.returncode != 0:
            raise SlurmTestbedError(
                f"`{' '.join(args)}` exited with {done.returncode}: {(done.stderr or '').strip()}\n"
                f"{self.log_tail('slurmctld')}"
            )
        return done

    def squeue(self) -> list[dict[str, str]]:
        """Jobs not yet finished: dicts with job_id, name, state, reason, partition, nodes (the node list)."""
        out = self.run(["squeue", "-h", "-o", "%i|%T|%r|%P|%N|%j"], check=True).stdout
        keys = ("job_id", "state", "reason", "partition", "nodes", "name")
        return [dict(zip(keys, line.split("|", 5))) for line in out.splitlines() if line.strip()]

    def wait_no_jobs(self, timeout: float = 20.0) -> None:
        """Return once squeue is empty; SlurmTestbedError naming the jobs still there after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.squeue()
            if not jobs:
                return
            if time.monotonic() > deadline:
                raise SlurmTestbedError(
                    f"jobs still in the SLURM testbed's queue after {timeout:g} s: {jobs}. "
                    "Cancel them (scancel JOBID) or wait for them in the test."
                )
            time.sleep(0.2)

    def wait_job(self, job_id: str, timeout: float = 180.0) -> dict[str, str]:
        """Wait until job ``job_id`` has ended; ``scontrol show job``'s fields (JobState, ExitCode, ...).

        What ``sbatch --wait`` does, but polled every 0.2 s: sbatch's own poll sleeps longer and longer (a job of
        a few seconds cost 40 s in the suite)."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.run(["scontrol", "-o", "show", "job", job_id], timeout=30)
            fields = dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)
            if fields.get("JobState", "PENDING") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return fields
            if time.monotonic() > deadline:
                raise SlurmTestbedError(f"job {job_id} did not end within {timeout:g} s: {fields or done.stderr}")
            time.sleep(0.2)

    def node_state(self, node: str) -> str:
        """scontrol's State of ``node``: IDLE, ALLOCATED, IDLE+NOT_RESPONDING, DOWN+NOT_RESPONDING, ..."""
        return self._node_info(node).get("State", "")

    def wait_node_down(self, node: str, timeout: float = 40.0) -> str:
        """Wait until slurmctld sees ``node`` as DOWN or NOT_RESPONDING; its state."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.node_state(node)
            if "DOWN" in state or "NOT_RESPONDING" in state:
                return state
            if time.monotonic() > deadline:
                raise SlurmTestbedError(f"node {node} still {state} {timeout:g} s after its slurmd was killed")
            time.sleep(0.5)

    def kill_slurmd(self, node: str, *, with_steps: bool = True) -> None:
        """SIGKILL node's slurmd, as if the machine died: with its slurmstepd and their tasks unless ``with_steps``.

        slurmctld notices within SlurmdTimeout (10 s): the node turns NOT_RESPONDING, then DOWN.
        """
        proc = self._procs.get(f"slurmd-{node}")
        if proc is None or proc.poll() is not None:
            raise SlurmTestbedError(f"slurmd for node {node} is not running; start it with start_slurmd({node!r})")
        victims = self._cluster_processes(node) if with_steps else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        slurm_procs.kill_all(victims)

    def start_slurmd(self, node: str, timeout: float = 30.0) -> None:
        """(Re)start node's slurmd and wait until slurmctld has its registration and shows it idle."""
        if self.slurmd_running(node):
            pid = self._procs[f"slurmd-{node}"].pid
            raise SlurmTestbedError(f"slurmd for node {node} already runs (pid {pid}); kill_slurmd({node!r}) first")
        self._start_slurmd_process(node)
        self._wait_node_idle(node, time.monotonic() + timeout)

    def slurmd_running(self, node: str) -> bool:
        proc = self._procs.get(f"slurmd-{node}")
        return proc is not None and proc.poll() is None

    def restore_nodes(self, timeout: float = 30.0) -> None:
        """Bring every node back to service: restart a killed slurmd, resume a node set DOWN or DRAIN by hand."""
        for node in NODES:
            if not self.slurmd_running(node):
                self.start_slurmd(node, timeout)
            elif any(flag in self.node_state(node) for flag in ("DOWN", "DRAIN", "FAIL")):
                self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=True)
                deadline = time.monotonic() + timeout
                self._wait(lambda n=node: self.node_state(n) == "IDLE", deadline, f"slurmd-{node}", "return to IDLE")

    def log_tail(self, name: str, lines: int = 40) -> str:
        """Last lines of a daemon's log: "munged", "slurmctld", "slurmd-n1" (or "n1"), "slurmd-n2"."""
        if name in NODES:
            name = f"slurmd-{name}"
        if self.tmpdir is None:
            return f"(no {name} log: the testbed never started)"
        log, out = self.tmpdir / f"{name}.log", self.tmpdir / f"{name}.out"
        text, extra = _tail(log, lines), _tail(out, lines)  # munged -F, and a daemon dying early, use stderr
        if not text.strip():
            return f"--- {out} ---\n{extra}"
        if extra.strip() and extra.strip().splitlines()[-1] not in text:
            text += f"--- {out.name} ---\n{extra}"
        return f"--- {log} ---\n{text}"

    # --- starting

    def _prepare(self) -> None:
        self.tmpdir = Path(tempfile.mkdtemp(prefix="ppkit-slurm-"))
        if len(str(self.tmpdir)) > 60:  # unix sockets (munge, slurmstepd) must stay under 108 characters
            shutil.rmtree(self.tmpdir)
            self.tmpdir = Path(tempfile.mkdtemp(prefix="ppkit-slurm-", dir="/tmp"))
        # munged wants others to be able to traverse to its socket (it warns, and without --force refuses)
        self.tmpdir.chmod(0o711)
        for sub in ("state", *(f"spool/{n}" for n in NODES)):
            (self.tmpdir / sub).mkdir(parents=True)
        key = self.tmpdir / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        (self.tmpdir / "plugstack.conf").write_text("")  # no SPANK plugins from /etc/slurm
        ports = free_ports(1 + len(NODES))
        self.ctld_port, self.node_ports = ports[0], dict(zip(NODES, ports[1:]))
        self.conf_path = self.tmpdir / "slurm.conf"
        self.conf_path.write_text(self._slurm_conf())
        self.env = {"SLURM_CONF": str(self.conf_path)}

    def _slurm_conf(self) -> str:
        return render_slurm_conf(self.tmpdir, self.ctld_port, self.node_ports, _user_name())

    def _spawn(self, name: str, cmd: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        # the markers come last: see slurm_procs.environ
        env = {**os.environ, **self.env, slurm_procs.MARK: str(self.tmpdir), **(extra_env or {})}
        # PR_SET_PDEATHSIG fires when the *thread* that started it ends: only the main thread lives long enough
        on_main = threading.current_thread() is threading.main_thread()
        with open(self.tmpdir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.tmpdir,
                start_new_session=True,  # its own process group, stopped as one
                preexec_fn=slurm_procs.die_with_parent if on_main else None,
            )
        self._procs[name] = proc
        return proc

    def _start_munged(self, deadline: float) -> None:
        d = self.tmpdir
        # -F: stay a child of ours (logging to stderr, so to munged.out); --force: an unusual TMPDIR's
        # permissions are a warning rather than a refusal.
        self._spawn("munged", [
            self.bin["munged"], "-F", "--force", f"--socket={d}/munge.sock", f"--key-file={d}/munge.key",
            f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed",
        ])
        self._wait(lambda: (d / "munge.sock").exists(), deadline, "munged", "create its socket")

    def _start_slurmd_process(self, node: str) -> None:
        self._slurmd_launched[node] = datetime.now().replace(microsecond=0)  # SlurmdStartTime has whole seconds
        self._spawn(f"slurmd-{node}", [self.bin["slurmd"], "-D", "-N", node, "-f", str(self.conf_path)],
                    {slurm_procs.NODE_MARK: node})

    def _wait_ctld(self, deadline: float) -> None:
        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.ctld_port), timeout=1):
                return True
            return False

        self._wait(listening, deadline, "slurmctld", f"listen on port {self.ctld_port}")

    def _wait_node_idle(self, node: str, deadline: float) -> None:
        # slurmd's registration carries its start time: an "idle" from before a kill does not count
        launched = self._slurmd_launched[node]

        def registered_idle() -> bool:
            info = self._node_info(node)
            started = _parse_time(info.get("SlurmdStartTime", ""))
            return info.get("State") == "IDLE" and started is not None and started >= launched

        self._wait(registered_idle, deadline, f"slurmd-{node}", f"register node {node} as idle")

    def _wait(self, ready, deadline: float, name: str, what: str) -> None:
        while not ready():
            for pname, proc in self._procs.items():
                if proc.poll() is not None and (pname == name or not pname.startswith("slurmd-")):
                    raise SlurmTestbedError(
                        f"{pname} exited with {proc.returncode} while waiting for {name} to {what}; see its log below"
                    )
            if time.monotonic() > deadline:
                raise SlurmTestbedError(f"{name} did not {what} in time (SLURM testbed in {self.tmpdir})")
            time.sleep(0.1)

    def _node_info(self, node: str) -> dict[str, str]:
        done = self.run(["scontrol", "-o", "show", "node", node], timeout=30)
        fields = {}
        for word in done.stdout.split():
            key, sep, value = word.partition("=")
            if sep:
                fields.setdefault(key, value)
        return fields

    # --- stopping

    def _cancel_all_jobs(self) -> None:
        ctld = self._procs.get("slurmctld")
        munged = self._procs.get("munged")
        if ctld is None or ctld.poll() is not None or munged is None or munged.poll() is not None:
            return
        with contextlib.suppress(SlurmTestbedError):
            jobs = [j["job_id"] for j in self.squeue()]
            if jobs:
                self.run(["scancel", *jobs], timeout=15)
                self.wait_no_jobs(timeout=10)

    def _stop_daemons(self, names: list[str]) -> None:
        slurm_procs.stop_groups([self._procs[n] for n in names if n in self._procs])

    def _cluster_processes(self, node: str | None = None) -> list[psutil.Process]:
        """This cluster's slurmstepd, their descendants and its jobs' tasks (of ``node`` only, if given)."""
        if self.tmpdir is None:
            return []
        daemons = {p.pid for p in self._procs.values()}
        return slurm_procs.cluster_processes(str(self.tmpdir), str(self.conf_path), daemons, node)

    def _all_tails(self) -> str:
        return "\n".join(self.log_tail(name, 20) for name in self._procs)


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def _user_name() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER", "root")


if __name__ == "__main__":  # python tests/slurm_testbed.py: start one, print how to use it, stop on Enter
    with SlurmTestbed() as tb:
        print(f"export SLURM_CONF={tb.conf_path}")
        print(tb.run(["sinfo"]).stdout)
        input("press Enter to stop the cluster ")
    sys.exit(0)
