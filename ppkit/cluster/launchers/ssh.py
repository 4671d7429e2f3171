"""Starting ``ppkit worker`` on another machine over ssh.

``Cluster(2, listen="10.0.0.1:29600", remote={"worker1": "alice@10.0.0.2"})`` runs, on 10.0.0.2,
``python3 -m ppkit worker --connect 10.0.0.1:29600 --name worker1``. The key travels on ssh's
standard input, never on a command line (where ``ps`` on either machine would show it). ssh runs
with BatchMode, so a missing key-based login fails at once instead of waiting for a password in a
notebook that cannot type one.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field

DEFAULT_SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10")


@dataclass
class SSHHost:
    """How to reach one worker's machine: ``SSHHost("alice@10.0.0.2", python="/opt/conda/bin/python")``."""

    destination: str
    python: str = "python3"
    iface: str | None = None
    ssh: tuple[str, ...] = field(default=DEFAULT_SSH)


def as_host(target) -> SSHHost:
    if isinstance(target, SSHHost):
        return target
    if isinstance(target, str) and target.strip():
        return SSHHost(target.strip())
    from ppkit.errors import ConfigError

    raise ConfigError(f"an ssh host must be 'user@host' or an SSHHost, got {target!r}.")


def remote_command(connect: str, name: str, python: str = "python3", iface: str | None = None) -> str:
    """The shell line run on the worker's machine: read the key from stdin, then become the worker."""
    argv = [python, "-m", "ppkit", "worker", "--connect", connect, "--name", name]
    if iface:
        argv += ["--iface", iface]
    return f"read -r PPKIT_KEY && export PPKIT_KEY && exec {shlex.join(argv)}"


def worker_command(target, connect: str, name: str) -> list[str]:
    """The local argv that starts worker ``name`` on ``target`` (see ``SSHHost``)."""
    host = as_host(target)
    return [*host.ssh, host.destination, remote_command(connect, name, host.python, host.iface)]


def start_worker(target, connect: str, name: str, key: bytes) -> subprocess.Popen:
    """Run ``worker_command`` and hand it the key; its output goes to a log (see ``log_tail``)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process, closed by stop()
    proc = subprocess.Popen(worker_command(target, connect, name), stdin=subprocess.PIPE,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log = log
    try:
        proc.stdin.write(key.hex().encode() + b"\n")
        proc.stdin.close()
    except OSError:
        pass  # ssh already exited; its log says why
    return proc


def log_tail(proc, limit: int = 2000) -> str:
    log = getattr(proc, "log", None)
    if log is None or log.closed:
        return ""
    log.seek(0)
    return log.read().decode("utf-8", "replace")[-limit:]


def stop(proc) -> None:
    from ppkit.transport import procs

    procs.stop_processes([proc], grace=2.0)
    if getattr(proc, "log", None) is not None:
        proc.log.close()
