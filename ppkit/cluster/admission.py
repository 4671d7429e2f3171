"""Admission: who may join a cluster that listens on the network, and on which terms.

Parses what the user passes (``listen="ADDR:PORT"``, ``key``, ``remote=`` names) and decides, for
each worker machine that connects, whether it can work with this master: the same Python
(major.minor), torch and ppkit, and a network interface the master can reach. The checks run
before anything is forked, and each refusal says what to change. ``ppkit doctor`` uses the same
version check, and its probe is answered here.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from dataclasses import dataclass

from ppkit.errors import ConfigError, LaunchError
from ppkit.transport import channel, ifaces, worker
from ppkit.transport.messages import AgentInfo, ProbeReply, Versions


@dataclass(frozen=True)
class JoinedAgent:
    """An admitted agent (remote launcher): its connection and what it said of itself."""
    conn: object
    info: AgentInfo

_NAME = re.compile(r"[A-Za-z0-9_-]+")
DEFAULT_PORT = 29600  # away from torchrun's 29500 (MASTER_PORT) and 29400 (c10d rendezvous)


def parse_listen(text) -> tuple[str, int]:
    """``"ADDR:PORT"`` (or ``"ADDR"`` for the default port) -> ``(addr, port)``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"listen must be 'ADDR:PORT', e.g. '10.0.0.1:{DEFAULT_PORT}', got {text!r}.")
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host, port = port, str(DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(
            f"listen must be 'ADDR:PORT' with a port from 0 to 65535, e.g. '10.0.0.1:{DEFAULT_PORT}', "
            f"got {text!r}.")
    try:
        host = socket.gethostbyname(host.strip("[]"))
    except OSError as exc:
        raise ConfigError(f"cannot resolve the listen address {host!r}: {exc}.") from exc
    return host, int(port)


def parse_key(key) -> bytes:
    """The control channel's key: given (bytes or hex), else $PPKIT_KEY, else a new random one."""
    if key is None:
        key = os.environ.get(channel.KEY_ENV)
        if not key:
            return channel.new_key()
    if isinstance(key, bytes):
        if len(key) < 16:
            raise ConfigError(
                f"the key must be at least 16 bytes long (32 hex digits), got {len(key)}: a shorter one can be "
                "guessed. Use the key the master prints, or leave key unset to have a new one made.")
        weak = key_weakness(key)
        if weak:
            raise ConfigError(
                f"the key given by key= (or ${channel.KEY_ENV}) is {weak}, so anyone who can reach the "
                "port could guess it, join the cluster and run code on it. Leave key unset (and "
                f"${channel.KEY_ENV} empty) to have a random one made and printed once, or make one "
                "with: python -c \"import secrets; print(secrets.token_hex(32))\"")
        return key
    try:
        decoded = bytes.fromhex(key)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            "the key must be hex digits, such as the PPKIT_KEY the master prints (or bytes); got "
            f"{type(key).__name__} of length {len(key) if hasattr(key, '__len__') else '?'}.") from exc
    return parse_key(decoded)  # outside the try: its length error is not a hex error


def key_weakness(key: bytes) -> str | None:
    """Why ``key`` is trivially guessable (all zeros, one byte repeated, a short pattern repeated,
    a counting sequence), or None. A random key is none of these, except with negligible odds."""
    if len(set(key)) == 1:
        return "all zeros" if key[0] == 0 else f"one byte (0x{key[0]:02x}) repeated"
    for period in range(2, 5):
        if all(key[i] == key[i % period] for i in range(len(key))):
            return f"a {period}-byte pattern ({key[:period].hex()}) repeated"
    steps = {(b - a) % 256 for a, b in zip(key, key[1:])}
    if len(steps) == 1:
        return "a counting sequence of bytes"
    return None


def mask_key(key: bytes) -> str:
    """The key as shown anywhere but the first start: enough to tell keys apart, too little to use.
    (The full key is printed once, where the other machine needs it; a saved notebook keeps its
    outputs, and error texts and restart messages land there.)"""
    return f"{key.hex()[:4]}..."


def join_command(key: bytes, master: str, name: str, full_key: bool = False) -> str:
    """What to type on a worker's machine to join ``master``; the key masked unless ``full_key``."""
    shown = key.hex() if full_key else f"{mask_key(key)} (the key printed at the first start)"
    return f"PPKIT_KEY={shown} ppkit worker --connect {master} --name {name}"


def remote_names(world_size: int, remote) -> list[str]:
    """The names of the remote workers, in rank order (``remote`` is a count, names, or a mapping)."""
    if remote is None:
        remote = world_size - 1
    if isinstance(remote, bool):
        raise ConfigError(f"remote must be a number of workers or a list of names, got {remote!r}.")
    if isinstance(remote, int):
        names = [f"worker{i}" for i in range(1, remote + 1)]
    elif isinstance(remote, (list, tuple, dict)):
        names = list(remote)
    else:
        raise ConfigError(
            f"remote must be a number of workers, a list of names such as ['worker1'], or a mapping "
            f"name -> ssh host, got {type(remote).__name__}.")
    bad = [n for n in names if not isinstance(n, str) or not _NAME.fullmatch(n)]
    if bad:
        raise ConfigError(f"worker names must be words like 'worker1', got {bad!r}.")
    if len(set(names)) != len(names):
        raise ConfigError(f"worker names must be different from each other, got {names!r}.")
    if not 1 <= len(names) <= world_size:
        raise ConfigError(
            f"a world of {world_size} rank(s) has room for 1 to {world_size} remote workers, "
            f"not {len(names)} ({names}). Raise world_size or name fewer workers.")
    return names


def rpc_remote_names(worker_names: list[str], remote):
    """Which workers of an RPC world are remote: the last ones (all of them by default).

    RPC names follow ranks (worker1, worker2, ...) and remote ranks come after local ones, so
    ``remote`` may be a count, or names (or a name -> ssh host mapping) ending the list.
    """
    if remote is None:
        return list(worker_names)
    names = remote_names(len(worker_names), remote)
    if isinstance(remote, int):  # a count: the last ones
        return worker_names[len(worker_names) - len(names):]
    if names != worker_names[len(worker_names) - len(names):]:
        raise ConfigError(
            f"in an RPC world the remote workers are the last ones, named by rank: with "
            f"{len(worker_names)} workers and {len(names)} remote, remote="
            f"{worker_names[len(worker_names) - len(names):]}, not {names}.")
    return remote if isinstance(remote, dict) else names  # a mapping also says where to ssh


def without_socket_vars(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ifaces.SOCKET_ENV_VARS}


def version_problem(ours: Versions, theirs: Versions, name: str, host: str) -> str | None:
    """Why a worker on ``host`` with versions ``theirs`` cannot join a master with ``ours``, or None.

    Python must agree on major.minor (functions travel as bytecode), torch and ppkit exactly.
    """
    def same(key):
        a, b = getattr(ours, key), getattr(theirs, key)
        return a.split(".")[:2] == b.split(".")[:2] if key == "python" else a == b

    diffs = [k for k in ("python", "torch", "ppkit") if not same(k)]
    if not diffs:
        return None
    listed = ", ".join(f"{k} {getattr(theirs, k)} (the master has {getattr(ours, k)})" for k in diffs)
    pins = " ".join(f"{k}=={getattr(ours, k)}" for k in diffs if k != "python")
    return (
        f"{name} on {host} runs {listed}. Every machine must run the same Python "
        "(major.minor), torch and ppkit: functions and tensors travel between them pickled, and "
        "torch.distributed needs the same torch on every rank. "
        + (f"Install the master's versions there (pip install {pins}) " if pins else
           "Use the same Python version there ")
        + "and start the worker again; `ppkit version` prints them on each machine.")


def interface_problem(info: AgentInfo, master_host: str) -> str | None:
    """Why a worker's gloo/TensorPipe interface cannot work with this master, or None."""
    addrs = info.iface_addrs
    if ifaces.is_loopback(master_host) or not addrs or not all(ifaces.is_loopback(a) for a in addrs):
        return None
    reached = info.local_address
    return (
        f"{info.name} on {info.host} would use interface {info.iface!r} "
        f"({', '.join(addrs)}) for gloo and TensorPipe, a loopback address that the master "
        f"({master_host}) cannot reach, so joining the process group would hang. It reached the "
        f"master from {reached}: start it with --iface naming that address's interface, or unset "
        "GLOO_SOCKET_IFNAME/TP_SOCKET_IFNAME there (`ppkit doctor` lists the interfaces).")


def join_problem(info: AgentInfo, master_host: str) -> str | None:
    """Why an expected agent cannot work with this master (versions, interface), or None."""
    return (version_problem(worker.versions(), info.versions, info.name, info.host)
            or interface_problem(info, master_host))


def master_interface(host: str) -> str:
    """The interface of this machine that has address ``host`` (where the master listens)."""
    if host == "0.0.0.0":
        raise ConfigError(
            "listen='0.0.0.0:PORT' does not say which address the workers should use for the "
            "rendezvous store and gloo. Listen on the address the other machines reach (e.g. "
            "listen='10.0.0.1:29600'; `ppkit doctor` lists this machine's addresses).")
    iface = ifaces.interface_of(host)
    if iface is None and not ifaces.is_loopback(host):
        have = ", ".join(f"{n} {' '.join(a)}" for n, a in ifaces.interfaces().items() if a)
        raise ConfigError(
            f"{host} is not an address of this machine, so the master cannot listen on it "
            f"(this machine has: {have}). Pass listen='ADDR:PORT' with one of these addresses.")
    return iface or ifaces.interface_of("127.0.0.1") or "lo"


def listen_error(exc: OSError, host: str, port: int) -> LaunchError:
    why = ("another program (or another cluster) already listens on that port"
           if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc))
    return LaunchError(
        f"cannot listen on {host}:{port}: {why}. Pick another port (listen='{host}:PORT'), or close "
        "the other cluster first.")


def handle_probe(conn) -> None:
    """Answer ``ppkit doctor``'s probe: this master's versions and host, then hang up."""
    try:
        conn.send(ProbeReply(socket.gethostname(), worker.versions()))
    except OSError:
        pass
    conn.close()
