"""torchft's lighthouse, started as a real process on 127.0.0.1 and stopped again.

The lighthouse is the one server of a torchft job: every replica group heartbeats to it and asks it, each step,
which groups form the quorum. It keeps no training state, so it is cheap to start and to lose.

    with Lighthouse() as lighthouse:
        print(lighthouse.address)      # http://127.0.0.1:PORT, what each Manager is given
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading

from ppkit.errors import ConfigError, LaunchError
from ppkit.lessons.fault_tolerance._process_group import child_env, stop_group
from ppkit.transport.procs import in_lasting_thread

HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL_HINT = ("pip install 'torchft==0.2.0' (or pip install -e '.[ft]' in a ppkit checkout); torchft 0.2.0 has "
                "wheels for Linux x86_64 only")


def require_torchft() -> None:
    """Raise LaunchError, saying what to install, where torchft cannot be imported."""
    if importlib.util.find_spec("torchft") is None:
        raise LaunchError(f"torchft is not installed in this Python ({sys.executable}), and the fault-tolerance "
                          f"lesson runs its Manager and lighthouse. Install it: {INSTALL_HINT}. On macOS, Windows "
                          f"or ARM Linux there is no wheel: read that section, or run it on a Linux x86_64 machine.")


class Lighthouse:
    """torchft's lighthouse in a process of its own (its own session, so a stop takes its whole tree).

    ``min_replicas``: the fewest replica groups a quorum may have; ``join_timeout_ms``: how long a new quorum
    waits for groups that heartbeat but have not asked yet; ``heartbeat_timeout_ms``: how long without a
    heartbeat before a group counts as dead (what a killed replica costs the others, at most).
    """

    def __init__(self, min_replicas: int = 1, join_timeout_ms: int = 10_000, heartbeat_timeout_ms: int = 1_500,
                 start_timeout_s: float = 30.0):
        for name, value in (("min_replicas", min_replicas), ("join_timeout_ms", join_timeout_ms),
                            ("heartbeat_timeout_ms", heartbeat_timeout_ms)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"Lighthouse({name}={value!r}): it must be a whole number of at least 1.")
        self.min_replicas = min_replicas
        self.join_timeout_ms = join_timeout_ms
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        if not start_timeout_s > 0:
            raise ConfigError(f"Lighthouse(start_timeout_s={start_timeout_s!r}): give the seconds to wait, > 0.")
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen | None = None
        self._log = None  # the lighthouse's log file, while it runs
        self.port: int | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        if self.port is None:
            raise LaunchError("the lighthouse has not been started: call start() or use it in a with block.")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The lighthouse process's pid while it runs, else None."""
        return self._process.pid if self.running else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """How the lighthouse process ended (-9: SIGKILL), while it is not stopped by stop(); else None."""
        return self._process.poll() if self._process is not None else None

    def start(self) -> Lighthouse:
        require_torchft()
        with self._lock:
            if self.running:
                return self
            command = [sys.executable, os.path.join(HERE, "_lighthouse_process.py"), str(self.min_replicas),
                       str(self.join_timeout_ms), str(self.heartbeat_timeout_ms)]
            # its log (a line per quorum tick at INFO) goes to a file: a pipe nobody reads would fill and block it
            self._log = tempfile.NamedTemporaryFile(prefix="ppkit-lighthouse-", suffix=".log")
            self._process = in_lasting_thread(lambda: subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, text=True,
                start_new_session=True, env=child_env()))
            line = _first_line(self._process, self.start_timeout_s)
            if not line.startswith("listening "):
                err = self._stop_and_read_log()
                raise LaunchError(f"torchft's lighthouse did not start within {self.start_timeout_s:g} s "
                                  f"(it said {line!r}; its log: {err.strip() or 'nothing'}). Check that "
                                  f"torchft imports ({INSTALL_HINT}) and that 127.0.0.1 can be bound.")
            self.port = int(line.split()[1])
        return self

    def stop(self, grace: float = 2.0) -> None:
        """SIGTERM the lighthouse's process group, then SIGKILL what is left; idempotent."""
        with self._lock:
            process, self._process = self._process, None
            if process is None:
                return
            stop_group(process, grace)
            process.stdout.close()
            self._log.close()

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the lighthouse's log (quorum decisions, heartbeats missed), until stop()."""
        try:
            with open(self._log.name, errors="replace") as f:
                return f.read()[-chars:]
        except (AttributeError, OSError):
            return ""

    def _stop_and_read_log(self) -> str:
        process, self._process = self._process, None
        stop_group(process, 1.0)
        log = self.log_tail(800)
        process.stdout.close()
        self._log.close()
        return log

    def __enter__(self) -> Lighthouse:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop(grace=0.5)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        state = f"running at {self.address}, pid {self.pid}" if self.running else "stopped"
        return f"Lighthouse({state}, min_replicas={self.min_replicas})"


def _first_line(process: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0].strip() if box else ""
