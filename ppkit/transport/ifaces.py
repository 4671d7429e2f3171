"""Network interfaces and addresses: which one reaches the master, and what gloo should bind to.

gloo and TensorPipe pick their address from the hostname unless GLOO_SOCKET_IFNAME and
TP_SOCKET_IFNAME name an interface. On many machines the hostname resolves to 127.0.0.1 or
127.0.1.1 (Debian, cloud images, containers), so a two-machine job advertises loopback and
hangs. The fix is to name the interface whose address the other machine can reach; these
helpers find it without sending a single packet.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys

SOCKET_ENV_VARS = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's (primary) IPv4 address
_BRIDGE_PREFIXES = ("docker", "br-", "virbr", "cni", "flannel", "vboxnet", "podman", "lxcbr")


def interfaces() -> dict[str, list[str]]:
    """Map each interface name to its IPv4 addresses (empty for an interface without one)."""
    found: dict[str, list[str]] = {}
    for _, name in socket.if_nameindex():
        found[name] = _ipv4_of(name)
    return found


def _ipv4_of(name: str) -> list[str]:
    if sys.platform.startswith("linux"):
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                return []
        return [socket.inet_ntoa(packed[20:24])]
    try:  # elsewhere, psutil if it is there (it is a test dependency)
        import psutil
    except ImportError:
        return []
    return [a.address for a in psutil.net_if_addrs().get(name, []) if a.family == socket.AF_INET]


def interface_of(address: str) -> str | None:
    """The name of the local interface that holds ``address``, or None."""
    for name, addrs in interfaces().items():
        if address in addrs:
            return name
    return None


def source_address(host: str, port: int = 9) -> str | None:
    """The local address this machine would use to reach ``host``, or None if there is no route.

    A UDP ``connect`` only asks the kernel's routing table: no packet leaves the machine.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))
            return sock.getsockname()[0]
    except OSError:
        return None


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def kind_of(name: str, addrs: list[str] | None = None) -> str:
    """A word for what an interface is: 'loopback', 'container bridge' or 'network'."""
    addrs = interfaces().get(name, []) if addrs is None else addrs
    if name.startswith("lo") or any(is_loopback(a) for a in addrs):
        return "loopback"
    if name.startswith(_BRIDGE_PREFIXES):
        return "container bridge"
    return "network"


def resolve_hostname(hostname: str | None = None) -> str | None:
    """What this machine's hostname resolves to (what gloo uses when GLOO_SOCKET_IFNAME is unset)."""
    try:
        return socket.gethostbyname(hostname or socket.gethostname())
    except OSError:
        return None


def socket_env(iface: str) -> dict[str, str]:
    """The variables that make gloo and TensorPipe bind to ``iface``."""
    return {var: iface for var in SOCKET_ENV_VARS}
