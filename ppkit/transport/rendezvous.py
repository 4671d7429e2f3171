"""A worker's watch on torch's ``env://`` and ``tcp://`` rendezvous (``init_process_group``).

``watch()`` wraps torch's two handlers in this process, for two reasons:

- Each rendezvous is remembered (``history()``). Re-creating a process group on the same port in
  a process that keeps running can hang in its first collective, or fail to connect (PyTorch
  issue 74666: the new group can meet the previous one's store, stale addresses and all), and
  nothing in the hang says so; the controller uses the history to explain a job that hangs.
- The rank that hosts the store binds it to 127.0.0.1 when the master address is a loopback one:
  torch's TCPStore would listen on every interface of the machine, and ppkit keeps local sockets
  on loopback. torch then reuses that server (it shares one per port within a process).
"""

from __future__ import annotations

import errno
import importlib
import ipaddress
import os
import socket
import sys
from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

from ppkit.transport.messages import Rendezvous

SCHEMES = ("env", "tcp")
_history: list[Rendezvous] = []  # each rendezvous, in order


def history() -> tuple[Rendezvous, ...]:
    """Every ``env://``/``tcp://`` rendezvous this process made since ``watch()``."""
    return tuple(_history)


def watch() -> None:
    """Wrap torch's ``env://`` and ``tcp://`` rendezvous handlers in this process (once)."""
    try:
        handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    except (ImportError, AttributeError):  # a torch without distributed, or a new layout
        return
    for scheme in SCHEMES:
        original = handlers.get(scheme)
        if original is not None and not getattr(original, "ppkit_watched", False):
            handlers[scheme] = _watched(scheme, original)


def _watched(scheme: str, original):
    def handler(url, **kwargs):
        where = _where(scheme, url)
        if where is None:  # torch's handler says what is missing
            yield from original(url, **kwargs)
            return
        host, port, rank, world_size = where
        server = _loopback_server(host, port, world_size, kwargs.get("timeout")) if rank == 0 else None
        rendezvous = original(url, **kwargs)
        try:
            found = next(rendezvous)
        except RuntimeError as exc:
            if rank == 0 and _in_use(exc):
                raise type(exc)(port_in_use(host, port)) from exc
            raise
        _history.append(Rendezvous(scheme, host, port))
        del server  # the store torch made holds the server now
        yield found
        yield from rendezvous

    handler.ppkit_watched = True
    return handler


def _where(scheme: str, url: str) -> tuple[str, int, int, int | None] | None:
    """(host, port, rank, world_size) of a rendezvous URL, or None where it lacks them."""
    try:
        parsed = urlparse(url)
        query = dict(parse_qsl(parsed.query))
        if scheme == "env":
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        else:
            host, port = parsed.hostname, parsed.port
        rank = int(query.get("rank", os.environ.get("RANK", -1)))
        size = query.get("world_size", os.environ.get("WORLD_SIZE"))
        return (host, port, rank, int(size) if size is not None else None) if host and port else None
    except (KeyError, ValueError):
        return None


def is_loopback_name(host: str) -> bool:
    """True for 127.0.0.1, ::1 and names that resolve only to loopback ("localhost")."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def _loopback_server(host: str, port: int, world_size: int | None, timeout):
    """A TCPStore server on 127.0.0.1:``port`` that torch's store for ``host`` reuses, or None
    (not a loopback host, Windows, or the port is taken: torch's own attempt says what is wrong)."""
    if sys.platform == "win32" or not is_loopback_name(host):
        return None
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server does
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError:
        sock.close()
        return None
    timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=300)
    return dist.TCPStore(host, port, world_size, is_master=True, wait_for_workers=False, timeout=timeout,
                         master_listen_fd=sock.detach(), multi_tenant=True)


def _in_use(exc: BaseException) -> bool:
    text = str(exc)
    return "EADDRINUSE" in text or os.strerror(errno.EADDRINUSE).lower() in text.lower()


def port_in_use(host: str, port: int) -> str:
    return (f"port {port} on this machine is already in use, so rank 0 cannot host the rendezvous store "
            f"at {host}:{port} (MASTER_PORT or the tcp:// URL). Another program holds it, or another "
            "process still in a process group created on that port (a ppkit cluster with "
            "process_group=False whose ranks did not call destroy_process_group(): cluster.close() "
            "frees it). Pick another port: any free one works, e.g. "
            "ppkit.lessons.data_parallel.free_port().")
