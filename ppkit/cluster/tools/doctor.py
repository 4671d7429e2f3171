"""``ppkit doctor``: what this machine needs to be right before it joins another one.

    report = diagnose(master="10.0.0.1:29600")   # in a notebook: display(report)
    print(report)                                # a short table, then what to do

It checks the versions (and, given the master's key, compares them with the master's), the
interfaces and their addresses, whether the master's address has a route and its port answers,
and whether gloo and TensorPipe would pick a usable address: they use the hostname's address
unless GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME name an interface, and a hostname often resolves to
127.0.0.1 or 127.0.1.1. Nothing here sends a packet anywhere but to the master you name.
"""

from __future__ import annotations

import errno
import os
import socket
import textwrap
from dataclasses import dataclass, field
from html import escape

from ppkit.checklist import Checklist
from ppkit.cluster.admission import DEFAULT_PORT, version_problem
from ppkit.errors import AuthenticationError, ConfigError
from ppkit.transport import channel, ifaces, worker
from ppkit.transport.messages import Probe, ProbeReply

CONNECT_TIMEOUT_S = 3.0


@dataclass(repr=False)
class Report(Checklist):
    """Doctor's checklist: the machine it ran on, its checks as a table, then what to do."""

    host: str = ""
    advice: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        width = max(len(c.name) for c in self.checks)
        lines = [f"ppkit doctor on {self.host}", f"{'check':<{width}}  status  detail"]
        for c in self.checks:
            wrapped = textwrap.wrap(c.detail, 76) or [""]
            lines.append(f"{c.name:<{width}}  {c.status:<6}  {wrapped[0]}")
            lines += [f"{'':<{width + 10}}{more}" for more in wrapped[1:]]
        if self.advice:
            lines += ["", "What to do:"] + [f"  {a}" for a in self.advice]
        return "\n".join(lines)

    __repr__ = __str__  # what a notebook shows where it cannot render HTML

    def _repr_html_(self) -> str:
        colours = {"ok": "#1a7f37", "info": "#57606a", "warn": "#9a6700", "FAIL": "#cf222e"}
        rows = "".join(
            f"<tr><td><code>{escape(c.name)}</code></td><td style='color:{colours[c.status]}'>"
            f"<b>{c.status}</b></td><td style='text-align:left'>{escape(c.detail)}</td></tr>"
            for c in self.checks)
        advice = "".join(f"<li><code>{escape(a)}</code></li>" for a in self.advice)
        return (f"<p><b>ppkit doctor</b> on <code>{escape(self.host)}</code></p><table><tr><th>check</th>"
                f"<th>status</th><th>detail</th></tr>{rows}</table>"
                + (f"<p>What to do:</p><ul>{advice}</ul>" if advice else ""))


def default_route_interface() -> str | None:
    """The interface of the default route (Linux), i.e. where traffic to unknown hosts goes."""
    try:
        with open("/proc/net/route") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if len(fields) > 2 and fields[1] == "00000000":
                    return fields[0]
    except OSError:
        pass
    return None


def probe(host: str, port: int, key: bytes | None, timeout: float = CONNECT_TIMEOUT_S):
    """Knock on the master's port: ``(status, detail, its ProbeReply or None)``."""
    where = f"{host}:{port}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.timeout:
        return "FAIL", (f"no answer from {where} within {timeout:g} s: the host is down, or a "
                        "firewall drops the packets (open the port on the master)."), None
    except OSError as exc:
        if exc.errno == errno.ECONNREFUSED:
            why = (f"connection refused: nothing listens on {where}. Is the master running, and did "
                   "it listen on this address (ppkit master --listen ADDR:PORT)? A firewall that "
                   "rejects the port looks the same.")
        else:
            why = f"cannot connect to {where}: {exc.strerror or exc}."
        return "FAIL", why, None
    try:
        sock.settimeout(timeout)
        greeting = sock.recv(64)
    except OSError:
        greeting = b""
    finally:
        sock.close()
    if b"#CHALLENGE#" not in greeting:
        return "warn", (f"{where} accepts connections but is not a ppkit master (another program "
                        "uses the port?)."), None
    if key is None:
        return "ok", (f"a ppkit master answers at {where} (set PPKIT_KEY to compare versions "
                      "with it)."), None
    try:
        conn = channel.connect((host, port), key, timeout=timeout)
    except AuthenticationError:
        return "FAIL", (f"a ppkit master answers at {where} but refuses this key: use the key it "
                        "printed (PPKIT_KEY)."), None
    except OSError as exc:
        return "FAIL", f"a ppkit master answers at {where} but the key check failed: {exc}.", None
    try:
        conn.send(Probe())
        reply = conn.recv()
    except (EOFError, OSError):
        return "warn", f"a ppkit master answers at {where} but did not say its versions.", None
    finally:
        conn.close()
    if not isinstance(reply, ProbeReply):
        return "warn", f"a ppkit master answers at {where} but did not say its versions.", None
    return "ok", f"a ppkit master answers at {where} and accepts this key.", reply


def diagnose(master: str | None = None, key: bytes | str | None = None, environ=None) -> Report:
    """Check this machine (and its way to ``master``, "ADDR:PORT"); return a printable ``Report``."""
    environ = os.environ if environ is None else environ
    target = None
    if master:
        try:
            host, port = channel.parse_address(master if ":" in master else f"{master}:{DEFAULT_PORT}")
            target = (socket.gethostbyname(host), port)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"--master must be ADDR:PORT, e.g. 10.0.0.1:{DEFAULT_PORT}; got {master!r} "
                              f"({exc}).") from exc
    if isinstance(key, str):
        key = bytes.fromhex(key)
    if key is None and environ.get(channel.KEY_ENV):
        key = bytes.fromhex(environ[channel.KEY_ENV])

    hostname = socket.gethostname()
    report = Report(host=hostname)
    ours = worker.versions()
    report.add("versions", "info", f"python {ours.python}, torch {ours.torch}, ppkit {ours.ppkit}")

    resolved = ifaces.resolve_hostname(hostname)
    trap = resolved is None or ifaces.is_loopback(resolved)
    if resolved is None:
        report.add("hostname", "warn", f"{hostname} does not resolve to an address; gloo falls back "
                                       "to loopback unless GLOO_SOCKET_IFNAME is set.")
    elif trap:
        report.add("hostname", "warn", f"{hostname} resolves to {resolved} (loopback): gloo and "
                                       "TensorPipe would advertise it to the other machines unless "
                                       "GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME name an interface.")
    else:
        report.add("hostname", "ok", f"{hostname} resolves to {resolved}")

    route_iface = route_from = None
    if target:
        route_from = ifaces.source_address(target[0], target[1])
        route_iface = ifaces.interface_of(route_from) if route_from else None
    best = route_iface or default_route_interface()
    for name, addrs in ifaces.interfaces().items():
        if not addrs:
            continue  # nothing can reach an interface without an address
        kind = ifaces.kind_of(name, addrs)
        note = " <- reaches the master" if name == route_iface else (
            " <- default route" if name == best and not target else "")
        report.add(f"interface {name}", "info", f"{' '.join(addrs) or 'no IPv4 address'} ({kind}){note}")

    if target:
        where = f"{target[0]}:{target[1]}"
        if route_from is None:
            report.add("route to master", "FAIL", f"this machine has no route to {target[0]}: check "
                                                  "the address, and that both machines share a network.")
        else:
            report.add("route to master", "ok", f"{target[0]} via {route_iface or '?'} (from {route_from})")
            status, detail, master = probe(target[0], target[1], key)
            report.add("master port", status, detail)
            if master is not None:
                theirs = master.versions
                problem = version_problem(theirs, ours, "this machine", hostname)
                report.add("versions vs master", "FAIL" if problem else "ok",
                           problem or f"same as the master ({master.host}): python "
                                      f"{theirs.python}, torch {theirs.torch}, ppkit {theirs.ppkit}")
            if status == "FAIL":
                report.advice.append(f"on the master, run `ppkit doctor` and listen on one of its "
                                     f"addresses; check that {where} is what it printed")

    if target and ifaces.is_loopback(target[0]):
        trap = False  # a master on this machine: loopback is the right address
    _check_socket_vars(report, environ, best, trap, bool(target))
    return report


def _check_socket_vars(report: Report, environ, best: str | None, trap: bool, have_master: bool) -> None:
    known = ifaces.interfaces()
    best_kind = ifaces.kind_of(best, known.get(best, [])) if best else None
    wrong = []
    for var in ifaces.SOCKET_ENV_VARS:
        value = environ.get(var)
        if value and value not in known:
            report.add(var, "FAIL", f"{value!r} is not an interface here (there are: {', '.join(known)}).")
            wrong.append(var)
        elif value and best and value != best:
            reason = "reaches the master" if have_master else "holds the default route"
            report.add(var, "warn", f"{value} (but {best} {reason}).")
            wrong.append(var)
        elif value:
            report.add(var, "ok", value)
        elif trap:
            report.add(var, "warn", "not set, and the hostname resolves to loopback.")
            wrong.append(var)
        else:
            report.add(var, "info", "not set: the hostname's address is used.")
    if best_kind == "container bridge":
        report.add("default interface", "warn",
                   f"{best} is a container bridge: other machines usually cannot reach it.")
    if wrong and best and best_kind == "network":
        report.advice.append(
            f"export GLOO_SOCKET_IFNAME={best} TP_SOCKET_IFNAME={best}   (for torchrun and your own "
            f"scripts; `ppkit worker` picks it by itself, or takes --iface {best})")
    elif wrong:
        report.advice.append("set GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME to the interface whose "
                             "address the other machines reach (see the interfaces above)")
    if not have_master and best and known.get(best):
        report.advice.append(f"on the master: ppkit master --listen {known[best][0]}:{DEFAULT_PORT}   "
                             f"(on a worker: ppkit doctor --master ADDR:{DEFAULT_PORT})")
