"""A network of this process's own: new user, network and mount namespaces, loopback up.

torch's rendezvous store, gloo's pairs and TensorPipe listen without any authentication: on a
machine shared by several people (a JupyterHub, a teaching server), anyone could connect to a
learner's ranks on 127.0.0.1 (and RPC unpickles what it receives). A process that calls
``enter()`` gets a loopback of its own, which no other user can enter (joining a namespace needs
capabilities in the user namespace that owns it: only this user's processes inside it have them),
and everything it forks shares it. It keeps its uid, gid and files: the new user namespace maps
this user (and its primary group) to itself, nothing else; other groups still count for file access
but cannot be changed there (setgroups is denied, as an unprivileged user namespace requires).
Processes outside (the notebook kernel) are reached through a Unix socket instead, in a folder only
this user can open. The mount namespace gives views of /etc/hosts (``_loopback_names``) and, with outbound
traffic, of /etc/resolv.conf (``_outbound_dns``).

``enter(outbound=True)`` also gives the namespace a way out, as rootless containers have it: slirp4netns, started
outside the namespace before it is made (a helper forked while this process still has one thread), attaches a tap
device inside and carries the namespace's outbound connections through its own sockets on the machine's network. It
forwards nothing inward, so what listens inside stays out of every other user's reach; loopback inside stays private
(``--disable-host-loopback``: the machine's 127.0.0.1 is not reached either). It dies with this process
(PR_SET_PDEATHSIG, and ``--exit-fd``). Without slirp4netns, or where it fails, the namespace stays isolated with only
its loopback, and ``enter`` says why on stderr (the fork server's log).

Linux only, unprivileged where the kernel allows it (user.max_user_namespaces > 0); Ubuntu's
AppArmor (kernel.apparmor_restrict_unprivileged_userns) may allow the namespace but withhold the
capabilities needed to bring its loopback up. ``enter()`` first tries every step in a forked child,
so a machine that refuses one leaves this process as it was, and says which step failed.
It must be called while the process has one thread (unshare of a user namespace requires it).
A process already in such a network (``inside()``: the isolated Jupyter kernel, ppkit/kernel/) is
left where it is: a second namespace would only split it from the processes it talks to.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading

CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
MS_BIND = 4096
HOSTS = "/etc/hosts"
# Reverse lookups of loopback addresses that the machine's /etc/hosts may lack. Outside, such a lookup
# falls through to DNS, which answers "no such name"; inside there is no DNS server to ask, the answer
# is "try again", and c10d's store then warns about every client it accepts.
# Names no forward lookup asks for, so "localhost" resolves as it does outside.
LOOPBACK_NAMES = "::1 ip6-localhost ip6-loopback\n::ffff:127.0.0.1 ip6-mapped-loopback\n"
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
LOOPBACK = b"lo"
PR_SET_PDEATHSIG = 1
SLIRP = "slirp4netns"
SLIRP_DNS = "10.0.2.3"  # slirp4netns's DNS forwarder, inside the namespace
SLIRP_READY_S = 10.0  # how long slirp4netns gets to set the namespace's tap device up
TUN = "/dev/net/tun"
RESOLV = "/etc/resolv.conf"


def _unshare() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWUSER|CLONE_NEWNET|CLONE_NEWNS): {os.strerror(err)}")


def _map_self(uid: int, gid: int) -> None:
    """Map this user (and its primary group) to itself in the new user namespace."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as exc:
            raise OSError(exc.errno, f"writing /proc/self/{name}: {exc.strerror}") from None


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", LOOPBACK, 0) + bytes(22)
        try:
            flags = struct.unpack("16sh", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request)[:18])[1]
            fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sh", LOOPBACK, flags | IFF_UP) + bytes(22))
        except OSError as exc:
            raise OSError(exc.errno, f"bringing the loopback up: {exc.strerror}") from None


def _overlay(target: str, text: str) -> None:
    """This namespace's view of ``target``: ``text`` (a bind mount of a file that is unlinked at once: nothing is
    left on disk). Best effort: the callers' views are conveniences."""
    try:
        fd, path = tempfile.mkstemp(prefix="ppkit-view-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(path, 0o644)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount(path.encode(), os.path.realpath(target).encode(), None, MS_BIND, None)
        os.unlink(path)
    except OSError:
        pass


def _loopback_names() -> None:
    """The machine's /etc/hosts plus names for the loopback addresses. Without it everything works, and c10d logs a
    warning per connection."""
    try:
        with open(HOSTS) as f:
            _overlay(HOSTS, f.read().rstrip("\n") + "\n" + LOOPBACK_NAMES)
    except OSError:
        pass


def dns_view(resolv_conf: str) -> str | None:
    """What the namespace should read as /etc/resolv.conf (None: the machine's own will do). A resolver on the
    machine's loopback (systemd-resolved's 127.0.0.53, a dnsmasq) is out of reach inside, where 127.0.0.1 is the
    namespace's own: ask slirp4netns's forwarder instead, which asks the machine's."""
    lines = resolv_conf.splitlines()
    on_loopback = [line for line in lines if line.split()[:1] == ["nameserver"] and len(line.split()) > 1
                   and (line.split()[1].startswith("127.") or line.split()[1] == "::1")]
    if not on_loopback:
        return None
    return "\n".join([f"nameserver {SLIRP_DNS}", *(line for line in lines if line not in on_loopback)]) + "\n"


def _outbound_dns() -> None:
    try:
        with open(RESOLV) as f:
            view = dns_view(f.read())
    except OSError:
        return
    if view is not None:
        _overlay(RESOLV, view)


def _steps() -> None:
    uid, gid = os.getuid(), os.getgid()
    _unshare()
    _map_self(uid, gid)
    _loopback_up()
    _loopback_names()


def _trial() -> str | None:
    """Run the steps in a forked child; None if all passed there, else the first failure in words."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read)
            _steps()
        except OSError as exc:
            os.write(write, (exc.strerror or str(exc)).encode(errors="replace")[:500])
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return said or f"the trial process ended with status {status}"
    return None


def inside() -> bool:
    """Whether this process already runs in a private network of this user's, as the isolated kernel
    does: a user namespace that maps some users only (the machine's own maps every uid), and a network
    with no interface but its loopback."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/uid_map") as f:
            if f.read().split()[:3] == ["0", "0", "4294967295"]:
                return False
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def outbound_missing() -> str:
    """Why a private network made here would have no way out ("" where slirp4netns can give it one)."""
    if shutil.which(SLIRP) is None:
        return f"{SLIRP} is not installed"
    if not os.access(TUN, os.R_OK | os.W_OK):
        return f"{TUN}, which {SLIRP} needs, is missing or closed to this user"
    return ""


class _Slirp:
    """slirp4netns, forked before the namespaces are made (so outside them), waiting to be told they exist."""

    def __init__(self):
        go_r, self.go = os.pipe()
        self.ready, ready_w = os.pipe()
        exit_r, self.keep = os.pipe()  # slirp4netns exits once every process holding ``keep`` is gone
        parent, tool = os.getpid(), shutil.which(SLIRP)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                for fd in (self.go, self.ready, self.keep):
                    os.close(fd)
                ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                if os.getppid() == parent and os.read(go_r, 1) == b"1":
                    quiet = os.open(os.devnull, os.O_RDWR)
                    os.dup2(quiet, 0)  # not the fork server's stdin (spare.py)
                    os.dup2(quiet, 1)  # its banner; what goes wrong comes on stderr, to the fork server's log
                    for fd in (ready_w, exit_r):
                        os.set_inheritable(fd, True)
                    os.execve(tool, [SLIRP, "--configure", "--mtu=65520", "--disable-host-loopback",
                                     f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(parent), "tap0"],
                              {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})  # none of ppkit's marks
            finally:
                os._exit(127)
        for fd in (go_r, ready_w, exit_r):
            os.close(fd)

    def start(self) -> str:
        """Tell it the namespaces exist: "" once their tap device is up, else why not (it is then gone)."""
        os.write(self.go, b"1")
        os.close(self.go)
        ready, _, _ = select.select([self.ready], [], [], SLIRP_READY_S)
        said = os.read(self.ready, 1) if ready else b""
        os.close(self.ready)
        if said == b"1":
            return ""
        code = self.stop()
        return (f"{SLIRP} did not set the network up within {SLIRP_READY_S:.0f} s" if code is None
                else f"{SLIRP} exited with status {code}; its own words are above")

    def stop(self) -> int | None:
        """End it; its exit status if it had ended by itself."""
        done, status = os.waitpid(self.pid, os.WNOHANG)
        if not done:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.keep)
        return os.waitstatus_to_exitcode(status) if done else None

    def cancel(self) -> None:
        os.close(self.go)  # EOF: it exits without starting slirp4netns
        os.close(self.ready)
        os.waitpid(self.pid, 0)
        os.close(self.keep)


def enter(outbound: bool = True) -> str | None:
    """Move this process into a new user+network namespace with its loopback up (already in one,
    ``inside()``: stay there); ``outbound``: with a way out through slirp4netns where it can be had.

    Returns None when done, else why not, in words (this process is then unchanged). A namespace without
    the asked-for way out is still made: why there is none goes to stderr."""
    if not sys.platform.startswith("linux"):
        return f"private networks need Linux namespaces (this is {sys.platform})"
    if inside():
        return None
    if threading.active_count() != 1:
        return "this process already runs several threads (unshare of a user namespace needs one)"
    reason = _trial()
    if reason is not None:
        return reason
    missing = outbound_missing() if outbound else ""
    slirp = _Slirp() if outbound and not missing else None
    try:
        _steps()
    except OSError as exc:  # passed in the trial a moment ago: only a changed machine gets here
        if slirp is not None:
            slirp.cancel()
        raise RuntimeError(f"a private network was allowed a moment ago and now is not: {exc}") from exc
    if slirp is not None:
        missing = slirp.start()
    if outbound and missing:
        print(f"ppkit: this private network has only its loopback, no way out ({missing}): downloads and "
              "connections to other machines fail here (docs/isolation.md).", file=sys.stderr, flush=True)
    elif outbound:
        _outbound_dns()
    return None
