"""Two "machines" on one Linux box, for lessons and tests: network namespaces joined by a cable.

    with TwoHosts() as hosts:                       # needs root and iproute2 (`ip`)
        hosts.popen(hosts.worker, ["ppkit", "worker", "--connect", "198.51.100.1:29600", ...])
        hosts.run(hosts.master, ["python", "master.py"])

Each host is a network namespace with its own loopback and an ``eth0`` holding one address; a
veth pair is the cable between them. Each also gets its own hostname (``hosta``, ``hostb``) that
resolves to 127.0.1.1, as Debian's /etc/hosts does: the trap that makes gloo advertise loopback
unless GLOO_SOCKET_IFNAME names the right interface. ``bridge=True`` adds a ``docker0`` bridge
on the worker that the master cannot reach, to show what choosing the wrong interface does.

Every process that talks to these addresses must run inside a namespace (``command``, ``run``,
``popen``): in the root namespace they have no route of their own. ``close()`` kills what runs
inside and deletes the namespaces; it runs on exit of the ``with`` block, even after an error.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ppkit.errors import LaunchError

ADDRESSES = ("198.51.100.1", "198.51.100.2")  # TEST-NET-2 (RFC 5737): never routed anywhere
PREFIX_LEN = 24
BRIDGE_ADDRESS = "172.17.0.1/16"  # where Docker's default bridge lives
_counter = itertools.count(1)


@dataclass
class Host:
    role: str        # "master" or "worker"
    netns: str       # the namespace's unique name
    hostname: str    # what socket.gethostname() says inside
    address: str     # eth0's address
    iface: str = "eth0"


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None if they can)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "making network namespaces needs root (run as root, or on a second machine)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command is missing (install iproute2 / util-linux)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise LaunchError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")


class TwoHosts:
    """Two namespaces ``master`` and ``worker``, joined by a veth pair; see the module docstring."""

    def __init__(self, addresses: tuple[str, str] = ADDRESSES, bridge: bool = False,
                 hostnames: tuple[str, str] = ("hosta", "hostb")):
        reason = unavailable_reason()
        if reason:
            raise LaunchError(f"cannot simulate two machines: {reason}.")
        tag = f"ppk{os.getpid()}x{next(_counter)}"  # unique per process and call; <= 15 characters
        self.master = Host("master", tag + "a", hostnames[0], addresses[0])
        self.worker = Host("worker", tag + "b", hostnames[1], addresses[1])
        self.bridge = bridge
        self._procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        try:
            self._create(tag)
        except BaseException:
            self.close()
            raise

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.master, self.worker

    def _create(self, tag: str) -> None:
        for host in self.hosts:
            _ip("netns", "add", host.netns)
            self._made.append(host.netns)
            etc = Path("/etc/netns") / host.netns  # `ip netns exec` mounts these over /etc
            etc.mkdir(parents=True, exist_ok=True)
            # the hostname resolves to 127.0.1.1 first, as on Debian; the other lines answer reverse
            # lookups (c10d's store asks for the name of each client, in IPv6-mapped form too)
            names = "".join(f"{a} {h.hostname}\n" for h in self.hosts
                            for a in (h.address, f"::ffff:{h.address}"))
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {host.hostname}\n{names}")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("link", "add", tag + "m", "type", "veth", "peer", "name", tag + "w")
        for host, end in ((self.master, tag + "m"), (self.worker, tag + "w")):
            _ip("link", "set", end, "netns", host.netns)
            _ip("-n", host.netns, "link", "set", end, "name", host.iface)
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{PREFIX_LEN}", "dev", host.iface)
            _ip("-n", host.netns, "link", "set", host.iface, "up")
        if self.bridge:
            _ip("-n", self.worker.netns, "link", "add", "docker0", "type", "bridge")
            _ip("-n", self.worker.netns, "addr", "add", BRIDGE_ADDRESS, "dev", "docker0")
            _ip("-n", self.worker.netns, "link", "set", "docker0", "up")

    # -- running things on a host -------------------------------------------------------------
    def command(self, host: Host, argv: list[str]) -> list[str]:
        """``argv`` as it runs on ``host``: inside its namespace, under its own hostname."""
        return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host.hostname, *argv]

    def run(self, host: Host, argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on ``host`` to completion (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(host, argv), check=False, timeout=timeout, **kwargs)

    def popen(self, host: Host, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on ``host``; ``close()`` stops it if it is still running."""
        proc = subprocess.Popen(self.command(host, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def run_both(self, master_argv: list[str], worker_argv: list[str], env=None,
                 timeout: float = 120) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
        """Start ``worker_argv`` on the worker host, run ``master_argv`` on the master host to the
        end, then wait for the worker; return both results (the worker's stderr is in its stdout)."""
        worker = self.popen(self.worker, worker_argv, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
        try:
            master = self.run(self.master, master_argv, env=env, timeout=timeout)
            out, _ = worker.communicate(timeout=timeout)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
        return master, subprocess.CompletedProcess(worker.args, worker.returncode, out, "")

    # -- cleaning up ----------------------------------------------------------------------------
    def _pids_inside(self) -> list[int]:
        pids = []
        for name in self._made:
            done = subprocess.run(["ip", "netns", "pids", name], check=False, capture_output=True,
                                  text=True)
            pids += [int(p) for p in done.stdout.split() if p.isdigit()]
        return pids

    def close(self) -> None:
        """Stop every process on both hosts, then delete the namespaces. Safe to call twice."""
        from ppkit.transport import procs

        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        procs.stop_pids([p.pid for p in self._procs] + self._pids_inside(), grace=2.0)
        for proc in self._procs:
            proc.wait()
        self._procs.clear()
        for name in self._made:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
        self._made.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return " <-> ".join(f"{h.role} {h.hostname} ({h.netns}, {h.iface} {h.address})" for h in self.hosts)
