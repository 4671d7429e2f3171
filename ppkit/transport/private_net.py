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
this user can open. The mount namespace serves one purpose: a view of /etc/hosts (``_loopback_names``).

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


def _loopback_names() -> None:
    """This namespace's view of /etc/hosts: the machine's, plus names for the loopback addresses
    (a bind mount of a file that is unlinked at once: nothing is left on disk). Best effort: without
    it everything works, and c10d logs a warning per connection."""
    try:
        with open(HOSTS) as f:
            text = f.read()
        fd, path = tempfile.mkstemp(prefix="ppkit-hosts-")
        with os.fdopen(fd, "w") as f:
            f.write(text.rstrip("\n") + "\n" + LOOPBACK_NAMES)
        os.chmod(path, 0o644)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount(path.encode(), os.path.realpath(HOSTS).encode(), None, MS_BIND, None)
        os.unlink(path)
    except OSError:
        pass


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


def enter() -> str | None:
    """Move this process into a new user+network namespace with its loopback up (already in one,
    ``inside()``: stay there).

    Returns None when done, else why not, in words (this process is then unchanged)."""
    if not sys.platform.startswith("linux"):
        return f"private networks need Linux namespaces (this is {sys.platform})"
    if inside():
        return None
    if threading.active_count() != 1:
        return "this process already runs several threads (unshare of a user namespace needs one)"
    reason = _trial()
    if reason is not None:
        return reason
    try:
        _steps()
    except OSError as exc:  # passed in the trial a moment ago: only a changed machine gets here
        raise RuntimeError(f"a private network was allowed a moment ago and now is not: {exc}") from exc
    return None

