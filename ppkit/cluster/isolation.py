"""Isolation between learners on one machine: which clusters run in a private network, and why not.

torch's store, gloo's pairs and TensorPipe accept connections without authentication. On a
machine shared by several learners (JupyterHub with a Unix user each, a teaching server), anyone
there could reach them on 127.0.0.1. There a cluster of the local launcher starts its fork
server, and so every worker, in a private user+network namespace (ppkit/transport/private_net.py)
that only this learner's processes are in; the kernel talks to them over ppkit's authenticated
channel on a Unix socket in a folder only this user can open. The namespace reaches out through
slirp4netns where it is installed (downloads, hubs, loggers), and lets nothing in.

``isolation=`` (``ppkit.start``, ``Cluster``) or the environment variable PPKIT_ISOLATION:

- ``"auto"`` (default): on a shared machine (``shared_machine()``), a private network where the machine
  allows it, else as before (the cluster's ``isolation`` says why not, and a warning says so once); on a
  one-user machine the ranks use the machine's network, as the kernel does: there is no one to protect;
- ``"netns"``: a private network or an error;
- ``"off"``: as before ppkit had it, every rank on the machine's network.

PPKIT_SHARED_MACHINE=1 or 0 overrides ``shared_machine()``'s guess (accounts from a directory that
/etc/passwd does not list; several accounts but a container per learner).

What cannot be isolated: an RPC world (``ppkit.start_rpc``) makes the kernel itself rank 0, and the
kernel stays on the machine's network, so its workers must too; the other launchers (spawn, remote,
slurm) run as before. Unless the kernel itself was started in a private network (the isolated
kernel, ppkit/kernel/): then everything it starts, an RPC world and the spawn launcher included, is
in that network already, and no cluster adds a second one.
"""

from __future__ import annotations

import os
import pwd
import sys
import warnings
from dataclasses import dataclass

from ppkit.errors import ConfigError
from ppkit.transport import private_net
from ppkit.transport.zygote import ISOLATION_ENV

MODES = ("auto", "netns", "off")
RPC_REASON = ("the notebook kernel is RPC rank 0 ('master'), so its workers share its network: any user "
              "of this machine can reach the RPC world's listeners")
SHARED_ENV = "PPKIT_SHARED_MACHINE"  # "1"/"0": overrides shared_machine()'s guess
ONE_USER = ("this machine has one user, so the ranks use its network as the kernel does (a private network "
            "protects only where others log in; docs/isolation.md)")
_warned = _warned_rpc = _warned_outbound = False  # each warning once per process


@dataclass(frozen=True)
class Isolation:
    """How a cluster's workers are kept from other users: ``private`` or not, and why not."""
    private: bool
    reason: str = ""
    whose: str = ""  # "": the cluster's own private network; else whose it shares

    def __str__(self) -> str:
        if self.private:
            return f"private network ({self.whose})" if self.whose else "private network"
        return f"none: {self.reason}"


KERNEL = Isolation(True, whose="the isolated kernel's")
NETWORK_LAUNCHERS = ("remote", "slurm")  # their ranks are on other machines: they need a network


def kernel_isolated() -> bool:
    """Whether this process (the notebook kernel) runs in a private network of its own already."""
    return private_net.inside()


def check_isolation(value, launcher: str) -> str:
    if value not in MODES:
        raise ConfigError(
            f"unknown isolation {value!r}; the choices are {', '.join(map(repr, MODES))}: 'auto' runs the "
            "workers in a private network where this machine allows it, 'netns' insists on one, 'off' keeps "
            "them on the machine's loopback.")
    if launcher in NETWORK_LAUNCHERS and kernel_isolated():
        raise ConfigError(
            f"launcher={launcher!r} runs ranks on other machines, and this kernel has no network: it is the "
            "isolated kernel (\"Python 3 (ppkit, isolated, no network)\"), whose only network is a private "
            "loopback. Use the local launcher here (ppkit.start(n)), or switch the notebook to the ordinary "
            "\"Python 3\" kernel (Kernel > Change Kernel) for SLURM and remote workers.")
    if value == "netns" and launcher != "local":
        raise ConfigError(
            f"isolation='netns' needs launcher='local' (a fork server on this machine); launcher={launcher!r} "
            "runs its ranks where a private network of this machine cannot hold them. Drop isolation= or use "
            "launcher='local'.")
    return value


def resolve(mode: str, launcher: str) -> tuple[str, bool, str]:
    """(``"netns"``, ``"off"`` or ``"kernel"``, whether a private network is required, the reason when off).
    ``"kernel"``: the kernel's own private network holds the workers already (even with "off": there is no
    other network to put them on), so the fork server makes none."""
    if launcher != "local":
        return "off", False, f"launcher={launcher!r} keeps its ranks on the machine's network"
    if kernel_isolated():
        return "kernel", False, ""
    where = f'isolation="{mode}"'
    if mode == "auto" and os.environ.get(ISOLATION_ENV, "auto") != "auto":
        mode, where = os.environ[ISOLATION_ENV], f"{ISOLATION_ENV}={os.environ[ISOLATION_ENV]}"
        if mode not in MODES:
            warnings.warn(f"{where} is not one of {', '.join(MODES)}; using 'auto'.", stacklevel=3)
            mode = "auto"
    if mode == "off":
        return "off", False, f"turned off ({where})"
    if not sys.platform.startswith("linux"):
        if mode == "netns":
            raise ConfigError(f"{where} needs Linux namespaces; this is {sys.platform}. Use 'auto' or 'off'.")
        return "off", False, f"private networks need Linux (this is {sys.platform})"
    shared = shared_machine()
    if mode == "auto" and not shared:
        return "off", False, ONE_USER
    no_way_out(private_net.outbound_missing(), shared)
    return "netns", mode == "netns", ""


def no_way_out(missing: str, shared: str) -> None:
    """Warn once that the ranks of a private network will have no network beyond their loopback."""
    global _warned_outbound
    if missing and not _warned_outbound:
        _warned_outbound = True
        why = f"this machine is shared ({shared}), so" if shared else "isolation='netns':"
        warnings.warn(
            f"{why} the workers run in a private network that other users cannot reach, and it has no way out "
            f"({missing}): downloads (datasets' download=True, the Hugging Face hub), loggers (W&B) and another "
            "machine's --master-addr fail on the ranks. Ask the administrator to install slirp4netns (`apt-get "
            "install slirp4netns`; /dev/net/tun must be open to users, mode 0666 as Debian has it), which gives "
            "the private network a way out and still lets nothing in; or pass isolation='off' (the ranks then "
            "use the machine's network, where other users can reach their listeners).", stacklevel=4)


def login_users() -> list[str]:
    """Users with a login shell and a uid in the range of people (not system accounts)."""
    first = 1000
    try:
        for line in open("/etc/login.defs"):
            if line.split()[:1] == ["UID_MIN"]:
                first = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    shut = ("nologin", "false", "sync", "halt", "shutdown")
    return [u.pw_name for u in pwd.getpwall()
            if first <= u.pw_uid < 65534 and not u.pw_shell.endswith(shut)]


def shared_machine() -> str:
    """Why this machine looks shared by several people ("" if it does not): a JupyterHub, or more
    than one user with a login; PPKIT_SHARED_MACHINE=1 or 0 says so instead."""
    said = os.environ.get(SHARED_ENV, "").strip().lower()
    if said in ("1", "0", "yes", "no", "true", "false"):
        return f"{SHARED_ENV}={os.environ[SHARED_ENV]}" if said in ("1", "yes", "true") else ""
    if said:
        warnings.warn(f"{SHARED_ENV}={os.environ[SHARED_ENV]!r} is neither 1 nor 0, so ppkit guesses whether this "
                      "machine is shared (docs/isolation.md). Set it to 1 (shared) or 0 (one user).", stacklevel=2)
    if os.environ.get("JUPYTERHUB_USER") or os.environ.get("JUPYTERHUB_API_URL"):
        return f"a JupyterHub serves this notebook (JUPYTERHUB_USER={os.environ.get('JUPYTERHUB_USER', '?')})"
    if sys.platform.startswith("linux"):
        users = login_users()
        if len(users) > 1:
            return f"{len(users)} users can log in here ({', '.join(users[:4])}{', ...' * (len(users) > 4)})"
    return ""


def fell_back(reason: str) -> None:
    """A cluster asked for 'auto' got no private network: warn once, where others could reach it."""
    global _warned
    shared = shared_machine()
    if shared and not _warned:
        _warned = True
        warnings.warn(
            f"this cluster's workers run on the machine's loopback, not in a private network ({reason}). "
            f"This machine is shared ({shared}), so other users could connect to torch's unauthenticated "
            "listeners of your workers. Ask the administrator to allow unprivileged user namespaces "
            "(`ppkit preflight` says what failed), or set PPKIT_ISOLATION=off to silence this.", stacklevel=2)


def refused(reason: str) -> str:
    """The error for isolation='netns' on a machine that refuses a private network."""
    return (f"isolation='netns' asks for the workers in a private network, and this machine refused one: "
            f"{reason}. Unprivileged user namespaces must be allowed (sysctl user.max_user_namespaces > 0; on "
            "Ubuntu also kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for this "
            "Python). Or use isolation='auto', which falls back to the machine's loopback and says so.")


def cluster_words(found: Isolation) -> tuple[str, str, str]:
    """(status, words, fix) for ``ppkit preflight``'s cluster check: is a learner's cluster isolated?"""
    if found.private:
        return "ok", "workers in a private network (other users cannot reach them)", ""
    shared = shared_machine()
    words = f"workers not isolated ({found.reason})"
    if not shared:
        return "ok", words, ""
    return "warn", f"{words}; this machine is shared ({shared}), so other users can connect to them", (
        "ask the administrator to allow unprivileged user namespaces (docs/isolation.md)")


def kernel_words() -> str:
    """For ``ppkit preflight``'s ports line: does this process (a kernel) run isolated?"""
    if kernel_isolated():
        return ("kernel isolated: a private network of its own, its 127.0.0.1 its own (other users cannot reach "
                "what it starts, an RPC world included; no network, so no pip install here)")
    return "kernel not isolated (on the machine's network)"


def rpc_words(pids, channel: tuple[str, int]) -> tuple[str, str, str]:
    """(status, words, fix) for the RPC world check: its processes' listening sockets besides ppkit's
    ``channel``, counted from /proc. Only counted: TensorPipe's short-lived listeners take the first
    connection that comes, so a probe would steal a connection the world itself expects."""
    from ppkit.cluster.exposure import listeners

    found = [e for e in listeners(pids) if e.kind == "tcp" and (e.address, e.port) != tuple(channel)]
    if kernel_isolated():
        return "ok", (f"{len(found)} listening sockets of torch's, all in the isolated kernel's private network "
                      "(other users cannot reach them)"), ""
    words = f"{len(found)} listening sockets of torch's on the machine's loopback, none with authentication"
    shared = shared_machine()
    if not shared:
        return "ok", words, ""
    return "warn", (f"{words}, and this machine is shared ({shared}): the kernel is RPC rank 0, so an RPC world "
                    "cannot be isolated; any user here can reach it while it runs (notebooks 04-06)"), (
        "on a shared machine, run the RPC notebooks in the kernel \"Python 3 (ppkit, isolated, no network)\" "
        "(`ppkit kernel install --isolated`; docs/isolation.md)")


def rpc_isolation() -> Isolation:
    """An RPC world's isolation: none (the kernel is rank 0), unless the kernel is the isolated one;
    on a shared machine, a warning once."""
    global _warned_rpc
    if kernel_isolated():
        return KERNEL
    shared = shared_machine()
    if shared and not _warned_rpc:
        _warned_rpc = True
        warnings.warn(
            f"this machine is shared ({shared}), and an RPC world cannot be kept from the other users: "
            f"{RPC_REASON} while it runs. Close it (world.close()) when you are done; see docs/isolation.md.",
            stacklevel=3)
    return Isolation(False, RPC_REASON)
